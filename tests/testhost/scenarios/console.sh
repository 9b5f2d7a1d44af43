# A command typed on the serial console runs and its output comes back.
cp "$ROOTFS" root.ext4
mkfifo in.fifo
(
	i=0
	until grep -q "microvirt: shell ready" console.log 2>/dev/null; do
		i=$((i + 1))
		[ $i -ge 600 ] && break
		sleep 0.2
	done
	sleep 1
	printf 'echo "typed-$((6 * 7))"\n'
	sleep 2
	printf 'exit\n'
	sleep 60
) > in.fifo &
feeder=$!
vm console --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 \
	--cmdline "root=/dev/vda rw quiet microvirt.scenario=console" < in.fifo
kill $feeder 2>/dev/null
