# Snapshot and restore of a Linux guest. Boot with the root on an overlay, a NIC on a TAP and a
# virtio-rng device,
# write a file, snapshot through the control socket, resume and shut the original down. Five
# seconds later restore onto another overlay and the same TAP: a command typed on the console
# runs, the file and a new write are on the root disk, TCP to the test host works, and the
# guest's wall clock matches the test host's (restore advances the guest's clocks by the time
# that passed): the guest's `date +%s` against the test host's when that line arrives. The
# restore's new VM generation ID makes the kernel reseed its RNG (`crng reseeded due to virtual
# machine fork` in its log: none before the snapshot, one after the restore).
tunctl -t mvtap0 >/dev/null || echo "check tunctl failed"
ip addr add 10.0.2.1/24 dev mvtap0
ip link set mvtap0 up
CMD="root=/dev/vda rw quiet ip=10.0.2.2::10.0.2.1:255.255.255.0::eth0:off microvirt.scenario=console"
mkfifo in1.fifo in2.fifo
(
	wait_line first.log "microvirt: shell ready" 600
	sleep 1
	# /dev/random blocks until the kernel's RNG is seeded (the virtio-rng device seeds it at
	# once): only a seeded RNG reseeds on a new VM generation ID, and says so in the kernel log.
	# Each line is typed once the previous one's output came.
	printf 'head -c 1 /dev/random > /dev/null; echo rng-seeded\n'
	wait_line first.log "^rng-seeded" 150
	printf 'echo "vm-forks-$(dmesg | grep -c "machine fork")"\n'
	wait_line first.log "^vm-forks-" 150
	printf 'echo before-snapshot > /marker; sync; echo "marker-$((40 + 2))"\n'
	wait_line first.log "^marker-42" 150
	"$MICROVM" control "$WORK/ctl.sock" "{\"cmd\":\"snapshot\",\"dir\":\"$WORK/snap\"}" > snapshot.json 2>&1
	# The original goes on (on its own overlay) and shuts down.
	"$MICROVM" control "$WORK/ctl.sock" '{"cmd":"resume"}' > /dev/null 2>&1
	printf 'exit\n'
	sleep 60
) > in1.fifo &
feeder=$!
vm first --kernel "$VMLINUX" --mem-mib 256 --disk "path=$ROOTFS,overlay=$WORK/o1.ovl" --rng \
	--net tap=mvtap0,mac=06:00:0a:00:02:02 --control-socket "$WORK/ctl.sock" --cmdline "$CMD" < in1.fifo
kill $feeder 2>/dev/null
echo "check snapshot $(cat snapshot.json)"
echo "check snapshot-files $(ls snap | tr '\n' ' ')"
sleep 5
nc -l -p 5000 </dev/null > from-guest.txt &
listener=$!
# Each command is typed once the previous one's output arrived (a line typed earlier is echoed
# into the middle of that output on a slow test host).
(
	sleep 2
	printf 'echo "typed-$((6 * 7))"\n'
	wait_line second.log "^typed-42"
	printf 'echo "vm-forks-$(dmesg | grep -c "machine fork")"\n'
	wait_line second.log "^vm-forks-"
	printf 'echo "guest-time $(date +%%s)"\n'
	wait_line second.log "^guest-time "
	printf 'cat /marker\n'
	wait_line second.log "^before-snapshot"
	printf 'echo after-restore > /after; sync; echo "disk-$(cat /after)"\n'
	wait_line second.log "^disk-"
	printf 'echo hello-after-restore|nc -w 5 10.0.2.1 5000&&echo net-sent\n'
	wait_line second.log "^net-sent"
	printf 'exit\n'
	sleep 60
) > in2.fifo &
feeder=$!
# As `vm`, and each `guest-time` line is stamped with the test host's time when it arrives.
: > second.log
echo "check vm second start $(cut -d' ' -f1 /proc/uptime)"
{ timeout 120 "$MICROVM" --restore "$WORK/snap" --disk "path=$ROOTFS,overlay=$WORK/o2.ovl" \
	--net tap=mvtap0 < in2.fifo 2>&1; echo "$?" > second.rc; } |
	while IFS= read -r l; do
		case "$l" in "guest-time "*) echo "check host-time $(date +%s) ${l#guest-time }" ;; esac
		echo "[second] $l"
		echo "$l" >> second.log
	done
echo "check vm second exit=$(cat second.rc 2>/dev/null || echo missing) end $(cut -d' ' -f1 /proc/uptime)"
kill $feeder $listener 2>/dev/null
wait 2>/dev/null
echo "check host got $(cat from-guest.txt)"
ip link del mvtap0 2>/dev/null || tunctl -d mvtap0 >/dev/null 2>&1
