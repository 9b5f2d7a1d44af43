# Shared by every scenario script (busybox sh). Environment: MICROVM VMLINUX BZIMAGE ROOTFS INITRD WORK.
# Lines the Rust tests parse start with "check " (from here) or "microvirt: " (from the guest).

# vm NAME [microvm args...]: runs microvm under a timeout, streams its console prefixed with
# [NAME], keeps it in $WORK/NAME.log and prints "vm NAME exit=RC". A VM given no
# `--control-socket` gets $WORK/NAME.ctl, for the stall watch below.
vm() {
	_n=$1
	shift
	: > "$WORK/$_n.log"
	rm -f "$WORK/$_n.rc"
	_sock=
	_prev=
	for _a in "$@"; do
		[ "$_prev" = --control-socket ] && _sock=$_a
		_prev=$_a
	done
	if [ -z "$_sock" ]; then
		_sock="$WORK/$_n.ctl"
		set -- "$@" --control-socket "$_sock"
	fi
	echo "check vm $_n start $(cat /proc/uptime | cut -d' ' -f1)"
	_vm_watch "$_n" "$_sock" &
	{ timeout "${VM_TIMEOUT:-120}" "$MICROVM" "$@" 2>&1; echo "$?" > "$WORK/$_n.rc"; } |
		while IFS= read -r _l; do
			echo "[$_n] $_l"
			echo "$_l" >> "$WORK/$_n.log"
		done
	_rc=$(cat "$WORK/$_n.rc" 2>/dev/null || echo missing)
	echo "check vm $_n exit=$_rc end $(cat /proc/uptime | cut -d' ' -f1)"
}

# _vm_watch NAME SOCKET: when the VM still runs STALL_DUMP seconds (default: two thirds of
# VM_TIMEOUT) of test-host uptime after it started, prints its vCPUs' state twice, 10 s apart, as
# "check vm NAME vcpu-state JSON" (registers, LAPIC timer, pending vectors, IOAPIC pins): a hang
# leaves its evidence in the log of the run that then times out. The deadline is read from
# /proc/uptime, not counted in loop turns (a busy test host makes each turn much longer than 1 s);
# the query itself is bounded, so a VMM that cannot pause its vCPUs says so.
_vm_watch() {
	_t0=$(cut -d. -f1 /proc/uptime)
	_limit=${STALL_DUMP:-$((${VM_TIMEOUT:-120} * 2 / 3))}
	until [ $(($(cut -d. -f1 /proc/uptime) - _t0)) -ge "$_limit" ]; do
		# Done: the VM ended, or its scenario did and removed the work dir.
		[ -e "$WORK/$1.rc" ] || [ ! -d "$WORK" ] && return 0
		sleep 1
	done
	for _k in 1 2; do
		[ -e "$WORK/$1.rc" ] || [ ! -d "$WORK" ] && return 0
		case "$MICROVM" in
		*virt-launcher) _s=$(timeout 30 "$MICROVM" vcpu-state --socket "$2" 2>&1) ;;
		*) _s=$(timeout 30 "$MICROVM" control "$2" '{"cmd":"vcpu-state"}' 2>&1) ;;
		esac
		_r=$?
		[ $_r = 143 ] && _s="no answer in 30 s (the VMM did not pause its vCPUs) $_s"
		echo "check vm $1 vcpu-state after $(($(cut -d. -f1 /proc/uptime) - _t0)) s: $_s"
		sleep 10
	done
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# wait_line FILE PATTERN [TRIES]: until a line of FILE matches the grep PATTERN, at most TRIES
# (default 100) turns of 0.2 s; false when it never came.
wait_line() {
	_i=0
	until grep -q "$2" "$1" 2>/dev/null; do
		_i=$((_i + 1))
		[ "$_i" -ge "${3:-100}" ] && return 1
		sleep 0.2
	done
}

token() { echo "tok$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"; }

# pod_network_up: a "pod" network namespace held by a sleeping process ($holder; `inpod CMD`
# runs CMD in it) whose eth0 (10.244.0.5/24) is the veth peer of the test host's vnode0
# (10.244.0.1, the "node"); writes $WORK/resolv.conf. pod_network_down removes both.
pod_network_up() {
	unshare -n sleep 100000 &
	holder=$!
	_i=0
	while [ "$(readlink /proc/$holder/ns/net)" = "$(readlink /proc/self/ns/net)" ]; do
		_i=$((_i + 1))
		[ $_i -ge 50 ] && { echo "check no pod netns"; break; }
		sleep 0.1
	done
	# busybox ip ignores "peer name": the kernel names the peer (veth0); find it, move it, rename it.
	ip link add vnode0 type veth || echo "check veth failed"
	_peer=$(ip -o link show | sed -n 's/^[0-9]*: \([^@:]*\)@vnode0:.*/\1/p')
	[ -n "$_peer" ] && ip link set "$_peer" netns "$holder" || echo "check netns move failed"
	inpod ip link set "$_peer" name eth0
	ip addr add 10.244.0.1/24 dev vnode0
	ip link set vnode0 up
	inpod ip link set lo up
	inpod ip addr add 10.244.0.5/24 dev eth0
	inpod ip link set eth0 up
	inpod ip route add default via 10.244.0.1
	echo "nameserver 10.244.0.1" > "$WORK/resolv.conf"
}
inpod() { nsenter -t "$holder" -n "$@"; }
pod_network_down() {
	kill "$holder" 2>/dev/null
	ip link del vnode0 2>/dev/null
}
