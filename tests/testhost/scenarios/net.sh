# The guest gets an address (ip= on the command line) and exchanges TCP with the test host
# over a TAP, both ways (busybox nc).
cp "$ROOTFS" root.ext4
tunctl -t mvtap0 >/dev/null || echo "check tunctl failed"
ip addr add 10.0.2.1/24 dev mvtap0
ip link set mvtap0 up
nc -l -p 5000 </dev/null > from-guest.txt &
listener=$!
(
	i=0
	until echo "hello-from-host" | nc -w 2 10.0.2.2 5001 2>/dev/null; do
		i=$((i + 1))
		[ $i -ge 300 ] && break
		sleep 0.3
	done
) &
sender=$!
vm net --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 --net tap=mvtap0,mac=06:00:0a:00:02:02 \
	--cmdline "root=/dev/vda rw quiet ip=10.0.2.2::10.0.2.1:255.255.255.0::eth0:off microvirt.scenario=net microvirt.peer=10.0.2.1"
kill $listener $sender 2>/dev/null
wait 2>/dev/null
echo "check host got $(cat from-guest.txt)"
ip link del mvtap0 2>/dev/null || tunctl -d mvtap0 >/dev/null 2>&1
