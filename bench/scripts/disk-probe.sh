#!/usr/bin/env bash
# How contended the boot benchmark's stressors make a disk: 4 KiB random reads at queue depth 1
# (what a boot's reads look like to the disk) timed alone, then beside 16 stressors run exactly
# as `yolo-boot-bench run --scenario contention` runs them (fio randrw 64 KiB, queue depth 4,
# O_DIRECT, a 512 MiB file each). Usage: disk-probe.sh [DIRECTORY on the disk to probe]
set -euo pipefail
dir=$(mktemp -d "${1:-/var/tmp}/yolo-disk-probe.XXXXXX")
trap 'rm -rf "$dir"' EXIT
for i in $(seq 0 16); do head -c 512M /dev/urandom >"$dir/f$i.dat"; done
sync

probe() {
    fio --name="probe-$1" --filename="$dir/f16.dat" --rw=randread --bs=4k --iodepth=1 \
        --direct=1 --ioengine=psync --runtime=20 --time_based --output-format=json \
        >"$dir/probe-$1.json"
}
probe alone
for i in $(seq 0 15); do
    fio --name="stressor$i" --filename="$dir/f$i.dat" --size=512M --rw=randrw --rwmixread=50 \
        --bs=64k --ioengine=libaio --iodepth=4 --direct=1 --time_based --runtime=30 \
        --output-format=json >"$dir/stressor$i.json" &
done
sleep 3  # the stressors reach a steady state, as in the benchmark
probe beside-16-stressors
wait

python3 - "$dir"/probe-*.json "$dir"/stressor*.json <<'PY'
import json, sys
total = 0
for path in sys.argv[1:]:
    for job in json.load(open(path))['jobs']:
        read, write = job['read'], job['write']
        if job['jobname'].startswith('probe'):
            print('%-28s %6.0f reads/s, mean latency %6.0f us' % (
                job['jobname'], read['iops'], read['lat_ns']['mean'] / 1000))
        else:
            total += read['bw_bytes'] + write['bw_bytes']
print('%-28s %6.0f MB/s (reads and writes of 64 KiB)' % ('16 stressors together', total / 1e6))
PY
