#!/bin/sh
# usage: stress-cpio.sh L1_CPIO OUT_CPIO [N]
# Rewrites a test-host initramfs of the e2e suite (`microvirt-testhost --test e2e`) so that its
# init, instead of the scenarios, boots the suite's `initrd` VM N times back to back (default 40)
# and prints "=== TRIPLE i" for each boot that ended in a triple fault. Boot the result with
# boot-loop.py. How the test host's nested-paging failures were found (docs/testing.md, "Nested
# paging in the test host"). The harness removes l1.cpio after a run: copy it from
# /tmp/microvirt-testhost-PID/ while the e2e test host runs.
set -eu
in=$(realpath "$1")
out=$(realpath -m "$2")
n=${3:-40}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cd "$d"
cpio -idm --quiet < "$in"
python3 - "$n" <<'PY'
import sys
n = sys.argv[1]
s = open('init').read()
i = s.index('echo "=== begin ')
j = s.index('echo "=== microvirt-testhost done')
loop = '''export WORK=/tmp/work-stress
mkdir -p "$WORK" && cd "$WORK"
. /scenarios/boot-initrd.sh
i=0
while [ $i -lt N ]; do
	i=$((i+1))
	vm s$i --kernel "$VMLINUX" --initrd "$INITRD" --mem-mib 256 --cmdline "microvirt.scenario=boot"
	grep -q "triple fault" "$WORK/s$i.log" && echo "=== TRIPLE $i"
	rm -f "$WORK/s$i.log"
done
cd /
'''.replace('N', n, 1)
open('init', 'w').write(s[:i] + loop + s[j:])
PY
find . | cpio -o -H newc --quiet > "$out"
