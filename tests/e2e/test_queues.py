"""Nothing the cloud publishes piles up in RabbitMQ for want of a consumer."""

import subprocess

import pytest


@pytest.mark.last
def test_no_queue_grows_without_a_consumer(cloud):
    listing = subprocess.run(
        ['rabbitmqctl', '-q', 'list_queues', '--no-table-headers', 'name', 'messages',
         'consumers'], capture_output=True, text=True, check=True).stdout
    stranded = []
    for line in listing.splitlines():
        name, messages, consumers = line.split()
        if int(consumers) == 0 and int(messages) > 0:
            stranded.append((name, int(messages)))
    assert not stranded, 'queues with messages and no consumer: %s' % stranded
