"""Scraping a Prometheus endpoint in tests."""

import urllib.request

from prometheus_client.openmetrics import parser as openmetrics


def scrape(url):
    """Every sample at ``url``, by (name, sorted label pairs)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers['Content-Type'].startswith('application/openmetrics-text')
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in openmetrics.text_string_to_metric_families(text)
            for sample in family.samples}
