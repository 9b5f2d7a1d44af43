# A command typed on the serial console runs and its output comes back, with ACPI (the shipped
# kernel's default: COM1 from the DSDT, its IRQ through the MADT's IOAPIC) and with `acpi=off`
# (the MP table's). Typed lines stay under the UART's 64-byte receive FIFO: a longer line reaches
# a Linux guest only after a stall of ~20 s (docs/testing.md).
cp "$ROOTFS" root.ext4
for v in console:"" console-noacpi:" acpi=off"; do
	name=${v%:*}
	rm -f in.fifo
	mkfifo in.fifo
	(
		i=0
		until grep -q "microvirt: shell ready" "$name.log" 2>/dev/null; do
			i=$((i + 1))
			[ $i -ge 600 ] && break
			sleep 0.2
		done
		sleep 1
		printf 'echo "typed-$((6 * 7))"\n'
		i=0
		until grep -q "^typed-42" "$name.log" 2>/dev/null; do
			i=$((i + 1))
			[ $i -ge 100 ] && break
			sleep 0.2
		done
		printf 'exit\n'
		sleep 60
	) > in.fifo &
	feeder=$!
	vm "$name" --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 \
		--cmdline "root=/dev/vda rw quiet microvirt.scenario=console${v#*:}" < in.fifo
	kill $feeder 2>/dev/null
done
