# Debian's stock kernel booted again and again, each boot a fresh microvm process with ACPI, 2
# vCPUs, a disk and a NIC, without `quiet` and with `nokaslr` (so the console shows how far a
# boot got, and a RIP can be looked up in the kernel's System.map). A boot whose init has not
# started after STALL seconds is looked into through the control socket (`vcpu-state`: each vCPU's
# registers, LAPIC timer and pending vectors, and the IOAPIC's pins, three times 5 s apart)
# and stopped. Not in the suite: `cargo xtask testhost stock-boot-soak`, for a hang that shows up
# only now and then (run it beside a busy machine).
VM_TIMEOUT=300
BOOTS=12
STALL=150
dd if=/dev/zero of=data.img bs=1M count=4 2>/dev/null
tunctl -t soaktap0 >/dev/null || echo "check tunctl failed"
ip link set soaktap0 up
i=0
while [ $i -lt $BOOTS ]; do
	i=$((i + 1))
	cp "$STOCK_DISK" root.img
	rm -f "$WORK/soak.sock"
	(
		t=0
		while [ $t -lt $STALL ]; do
			grep -q "microvirt: init up" "$WORK/soak$i.log" 2>/dev/null && exit 0
			[ -e "$WORK/soak$i.rc" ] && exit 0
			sleep 1
			t=$((t + 1))
		done
		echo "check soak $i stalled: no init after $STALL s"
		for k in 1 2 3; do
			echo "check soak $i vcpus $("$MICROVM" control "$WORK/soak.sock" '{"cmd":"vcpu-state"}' 2>&1)"
			sleep 5
		done
		"$MICROVM" control "$WORK/soak.sock" '{"cmd":"stop"}' >/dev/null 2>&1
	) &
	watcher=$!
	vm "soak$i" --kernel "$STOCK_VMLINUZ" --initrd "$STOCK_INITRD" --mem-mib 512 --vcpus 2 \
		--disk path=root.img --disk path=data.img,ro --net tap=soaktap0,mac=06:00:0a:00:05:02 \
		--control-socket "$WORK/soak.sock" --cmdline "root=/dev/vda1 ro nokaslr"
	wait $watcher
done
ip link del soaktap0 2>/dev/null || tunctl -d soaktap0 >/dev/null 2>&1
