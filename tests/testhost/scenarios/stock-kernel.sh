# Debian bookworm's stock cloud kernel and its initramfs-tools initramfs (tests/testhost/src/stock.rs),
# 2 vCPUs, root on /dev/vda1 of a partitioned disk, a second disk and a NIC. The kernel finds
# them only through ACPI (no MP-table parser, no command-line virtio devices); the init of the
# root reports them and powers off through ACPI S5: microvm exits 0 ("guest powered off").
VM_TIMEOUT=600
cp "$STOCK_DISK" root.img
dd if=/dev/zero of=data.img bs=1M count=4 2>/dev/null
tunctl -t sktap0 >/dev/null || echo "check tunctl failed"
ip link set sktap0 up
vm stock --kernel "$STOCK_VMLINUZ" --initrd "$STOCK_INITRD" --mem-mib 512 --vcpus 2 \
	--disk path=root.img --disk path=data.img,ro --net tap=sktap0,mac=06:00:0a:00:03:02 \
	--cmdline "root=/dev/vda1 ro quiet"
ip link del sktap0 2>/dev/null || tunctl -d sktap0 >/dev/null 2>&1
