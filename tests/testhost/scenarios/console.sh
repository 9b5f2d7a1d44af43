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
		printf 'echo "long-$(echo xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx | wc -c)"\n'
		i=0
		until grep -q "^long-" "$name.log" 2>/dev/null; do
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
