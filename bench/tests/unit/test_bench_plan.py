"""The boot benchmark's planning, result files and statistics."""

import pytest

from yolo_bench import plan
from yolo_bench.plan import Point
from yolo_bench import results
from yolo_bench.results import Result


def test_runs_interleave_policies_inside_each_repetition():
    runs = plan.plan(['hdd'], 'multi', [1, 4], ['normal', 'yolo'], 2, ['same', 'distinct'])
    # One VM of distinct images is one VM of the same image: measured once.
    assert len(runs) == 3 * 2 * 2
    first = [(r.repetition, r.point.size, r.point.images, r.point.policy) for r in runs[:6]]
    assert first == [(0, 1, 'same', 'normal'), (0, 1, 'same', 'yolo'),
                     (0, 4, 'same', 'normal'), (0, 4, 'same', 'yolo'),
                     (0, 4, 'distinct', 'normal'), (0, 4, 'distinct', 'yolo')]
    # Every repetition is complete before the next starts.
    assert [r.repetition for r in runs] == [0] * 6 + [1] * 6


def test_storages_are_planned_one_after_the_other():
    runs = plan.plan(['local', 'hdd'], 'contention', [0, 2], ['normal'], 3)
    assert [r.point.storage for r in runs] == ['local'] * 6 + ['hdd'] * 6
    assert {r.point.boots for r in runs} == {1}


def test_cache_modes_interleave_inside_each_repetition():
    runs = plan.plan(['hdd'], 'contention', [8], ['normal', 'yolo'], 2,
                     caches=['none', 'writethrough'])
    assert [(r.repetition, r.point.cache, r.point.policy) for r in runs[:4]] == [
        (0, 'none', 'normal'), (0, 'none', 'yolo'),
        (0, 'writethrough', 'normal'), (0, 'writethrough', 'yolo')]
    assert len(runs) == 8
    with pytest.raises(ValueError, match='unknown cache mode'):
        plan.plan(['hdd'], 'contention', [8], ['normal'], 1, caches=['unsafe'])


def test_cache_modes_are_kept_apart_in_files_tables_and_plots(tmp_path):
    from yolo_bench import plots
    measured = [Result(Point('hdd', 'contention', 8, 'same', policy, cache), 0, ms, (ms,), 10.0)
                for cache, policy, ms in (('none', 'normal', 158600), ('none', 'yolo', 41800),
                                          ('writethrough', 'normal', 90000))]
    path = tmp_path / 'boot.csv'
    for r in measured:
        results.append_csv(path, r)
    assert results.read_csv(path) == measured
    table = results.table(results.summarise(measured))
    assert '| hdd | none | contention | 8 | same | 158.6 (158.6-158.6) | 41.8 (41.8-41.8) ' \
        '| 3.79 |' in table
    assert '| hdd | writethrough | contention | 8 | same | 90.0 (90.0-90.0) | - | - |' in table
    paths = plots.plot(results.summarise(measured), tmp_path / 'plots')
    assert sorted(p.name for p in paths) == ['boot-contention-hdd-same-cache-none.png',
                                             'boot-contention-hdd-same.png']


def test_distinct_images_needed():
    runs = plan.plan(['hdd'], 'multi', [1, 2, 4], ['normal'], 1, ['same', 'distinct'])
    assert plan.images_needed(runs) == 4
    same_only = plan.plan(['hdd'], 'multi', [4], ['normal'], 1, ['same'])
    assert plan.images_needed(same_only) == 1
    assert Point('hdd', 'multi', 3, 'distinct', 'yolo').distinct_images == 3
    assert Point('hdd', 'contention', 3, 'same', 'yolo').boots == 1


@pytest.mark.parametrize('kwargs,message', [
    (dict(storages=['ssd']), 'unknown storage'),
    (dict(scenario='fast'), 'unknown scenario'),
    (dict(policies=['magic']), 'unknown policy'),
    (dict(images=['distinct'], scenario='contention'), 'only apply to the multi'),
    (dict(repetitions=0), 'at least one repetition'),
    (dict(sizes=[0]), 'at least one VM'),
])
def test_bad_plans_are_refused(kwargs, message):
    args = dict(storages=['hdd'], scenario='multi', sizes=[1], policies=['normal'],
                repetitions=1, images=['same'])
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        plan.plan(**args)


def test_memory_scenario_has_its_own_policies():
    runs = plan.plan(['local'], 'memory', [512], list(plan.MEMORY_POLICIES), 1)
    assert [r.point.policy for r in runs] == ['normal', 'yolo', 'yolo-unlocked']
    with pytest.raises(ValueError):
        plan.plan(['local'], 'memory', [512], ['warm'], 1)


def result(policy, size, ms, rep=0, images='same'):
    return Result(Point('hdd', 'multi', size, images, policy), rep, ms, (ms, ms - 100), 12.5,
                  ms / 2000, ms / 4000)


def test_csv_round_trip(tmp_path):
    path = tmp_path / 'boot.csv'
    written = [result('normal', 1, 30000), result('yolo', 1, 10000, rep=1)]
    results.append_csv(path, written[0])
    results.append_csv(path, written[1])
    assert results.read_csv(path) == written
    assert path.read_text().count('storage,scenario') == 1


def test_csv_without_the_later_columns_reads_them_as_zero(tmp_path):
    path = tmp_path / 'boot.csv'
    path.write_text('storage,scenario,size,images,policy,repetition,boot_ms,boot_ms_each,'
                    'guest_cpu_s\nhdd,multi,1,same,yolo,0,24000,24000,20.5\n')
    (old,) = results.read_csv(path)
    assert (old.boot_ms, old.guest_cpu_s, old.vcpu_run_s, old.vcpu_runqueue_s) == \
        (24000, 20.5, 0.0, 0.0)
    assert old.point.cache == 'writethrough'
    assert '| yolo | 24.0 | - | - | - |' in results.profile_table(results.summarise([old]))


def test_csv_with_other_columns_is_refused(tmp_path):
    path = tmp_path / 'boot.csv'
    path.write_text('storage,boot\nhdd,1\n')
    with pytest.raises(ValueError, match='expected columns'):
        results.read_csv(path)


def test_summaries_take_median_min_max_of_the_longest_boots():
    measured = [result('normal', 4, ms, rep) for rep, ms in enumerate([50000, 70000, 60000])]
    measured += [result('yolo', 4, ms, rep) for rep, ms in enumerate([12000, 10000, 30000])]
    summaries = results.summarise(measured)
    normal, yolo = summaries
    assert (normal.median_ms, normal.min_ms, normal.max_ms, normal.runs) == (60000, 50000, 70000, 3)
    assert (yolo.median_ms, yolo.min_ms, yolo.max_ms) == (12000, 10000, 30000)
    assert results.ratio(summaries, yolo.point, 'yolo', 'normal') == 5.0
    assert results.ratio(summaries, yolo.point, 'yolo', 'warm') is None
    table = results.table(summaries)
    assert ('| hdd | writethrough | multi | 4 | same | 60.0 (50.0-70.0) | 12.0 (10.0-30.0) '
            '| 5.00 |') in table
    # Profile of the median run: 60 s = 30 s running + 15 s waiting for a CPU + 15 s blocked.
    assert (normal.run_s, normal.runqueue_s, normal.blocked_s) == (30.0, 15.0, 15.0)
    assert '| hdd | writethrough | multi | 4 | same | normal | 60.0 | 30.0 | 15.0 | 15.0 |' in \
        results.profile_table(summaries)


def test_memory_profiles_show_what_was_swapped_in(tmp_path):
    point = Point('hdd', 'memory', 256, 'same', 'yolo-unlocked')
    measured = [Result(point, rep, 40000, (40000,), 25.0, 24.0, 0.5, mib)
                for rep, mib in enumerate([60.0, 70.5, 10.0])]
    path = tmp_path / 'boot.csv'
    for r in measured:
        results.append_csv(path, r)
    assert results.read_csv(path) == measured
    (summary,) = results.summarise(measured)
    assert summary.swapped_in_mib == 60.0
    table = results.profile_table([summary])
    assert table.splitlines()[0].endswith('| swapped in (MiB) |')
    row = ('| hdd | writethrough | memory | 256 | same | yolo-unlocked | 40.0 | 24.0 | 0.5 | 15.5 '
           '| 60.0 |')
    assert row in table
    # Other scenarios keep the table without it.
    assert 'swapped' not in results.profile_table(results.summarise([result('yolo', 1, 1000)]))


def test_plots_are_written(tmp_path):
    from yolo_bench import plots
    measured = [result(p, n, 1000 * n * (3 if p == 'normal' else 1), rep)
                for p in ('normal', 'yolo') for n in (1, 2, 4) for rep in range(3)]
    paths = plots.plot(results.summarise(measured), tmp_path)
    assert [p.name for p in paths] == ['boot-multi-hdd-same.png']
    assert paths[0].read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
