# Debian's stock kernel booted again and again, each boot a fresh microvm process with ACPI, 2
# vCPUs, a disk and a NIC, without `quiet` and with `nokaslr` (so the console shows how far a
# boot got, and a RIP can be looked up in the kernel's System.map). A boot still running after
# STALL_DUMP seconds gets the prelude's stall watch (`vcpu-state`: each vCPU's registers, LAPIC
# timer and pending vectors, and the IOAPIC's pins, twice 10 s apart) and is ended by its
# VM_TIMEOUT. Not in the suite: `cargo xtask testhost stock-boot-soak`, for a hang that shows
# up only now and then (run it beside a busy machine).
VM_TIMEOUT=300
STALL_DUMP=200
BOOTS=12
dd if=/dev/zero of=data.img bs=1M count=4 2>/dev/null
tunctl -t soaktap0 >/dev/null || echo "check tunctl failed"
ip link set soaktap0 up
i=0
while [ $i -lt $BOOTS ]; do
	i=$((i + 1))
	cp "$STOCK_DISK" root.img
	vm "soak$i" --kernel "$STOCK_VMLINUZ" --initrd "$STOCK_INITRD" --mem-mib 512 --vcpus 2 \
		--disk path=root.img --disk path=data.img,ro --net tap=soaktap0,mac=06:00:0a:00:05:02 \
		--cmdline "root=/dev/vda1 ro nokaslr"
done
ip link del soaktap0 2>/dev/null || tunctl -d soaktap0 >/dev/null 2>&1
