# Commands typed on the serial console run and their output comes back: a short one, then one
# longer than the UART's 64-byte receive FIFO, with nothing typed after it until its output came
# (the VMM refills the FIFO from its input as the guest drains it). With ACPI (the shipped
# kernel's default: COM1 from the DSDT, its IRQ through the MADT's IOAPIC) and with `acpi=off`
# (the MP table's).
cp "$ROOTFS" root.ext4
for v in console:"" console-noacpi:" acpi=off"; do
	name=${v%%:*}
	rm -f in.fifo
	mkfifo in.fifo
	(
		wait_line "$name.log" "microvirt: shell ready" 600
		sleep 1
		printf 'echo "typed-$((6 * 7))"\n'
		wait_line "$name.log" "^typed-42"
		printf 'echo "long-$(echo xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx | wc -c)"\n'
		wait_line "$name.log" "^long-"
		printf 'exit\n'
		sleep 60
	) > in.fifo &
	feeder=$!
	vm "$name" --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 \
		--cmdline "root=/dev/vda rw quiet microvirt.scenario=console${v#*:}" < in.fifo
	kill $feeder 2>/dev/null
done
