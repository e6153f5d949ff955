"""The locality benchmark's summary: time saved against Nova's own weighers' choice."""

from yolo_bench import locality


def row(scenario, chosen, seconds, nova_choice):
    return {'scenario': scenario, 'chosen': chosen, 'seconds': seconds,
            'nova_choice': nova_choice,
            'saved_vs_nova': seconds[nova_choice] - seconds[chosen]}


def test_the_summary_counts_faster_choices_and_the_time_saved():
    rows = [row('1', 'b', {'a': 100.0, 'b': 40.0}, 'a'),
            row('1', 'b', {'a': 90.0, 'b': 50.0}, 'a'),
            row('1', 'a', {'a': 45.0, 'b': 42.0}, 'a'),      # the slower one: nothing saved
            row('2', 'b', {'a': 80.0, 'b': 60.0}, 'b')]      # Nova chose it too
    lines = locality.summary(rows).splitlines()
    assert lines[1].split()[:2] == ['1', '3'] and '2 of 3' in lines[1]
    # 45 against 42 s is within the model's error: of the two decisive requests, both right.
    assert '2 of 2' in lines[1]
    # Saved: 60, 40, 0 s: mean 33.3, stdev 30.6, min 0, max 60.
    assert lines[1].endswith('33.3 s, 30.6 s, 0.0 s, 60.0 s')
    assert '1 of 1' in lines[2] and lines[2].endswith('0.0 s, 0.0 s, 0.0 s, 0.0 s')
