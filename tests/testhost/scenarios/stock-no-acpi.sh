# The same stock kernel with `microvm --no-acpi`: it finds neither the second CPU (it has no
# MP-table parser) nor the virtio devices (no command-line devices); initramfs-tools gives up on
# /dev/vda1 after its 30 s and, with microvm's `panic=1`, reboots: microvm exits 0. `quiet`
# keeps the kernel's errors (no RSDP) on the console and saves ~12 s of serial output.
VM_TIMEOUT=600
cp "$STOCK_DISK" root.img
vm noacpi --kernel "$STOCK_VMLINUZ" --initrd "$STOCK_INITRD" --mem-mib 512 --vcpus 2 \
	--disk path=root.img --no-acpi --cmdline "root=/dev/vda1 ro quiet"
