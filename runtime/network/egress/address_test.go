package egress

import (
	"net/netip"
	"testing"
)

func TestAddrBlocked(t *testing.T) {
	tests := []struct {
		addr    string
		blocked bool
	}{
		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"2606:4700::1111", false},
		{"2001:4860:4860::8888", false},
		{"127.0.0.1", true},
		{"127.255.255.254", true},
		{"10.1.2.3", true},
		{"172.16.0.1", true},
		{"172.31.255.255", true},
		{"172.32.0.1", false},
		{"192.168.1.1", true},
		{"169.254.77.77", true},
		{"169.254.169.254", true},
		{"100.64.0.1", true},
		{"100.100.100.200", true},
		{"100.128.0.1", false},
		{"0.0.0.0", true},
		{"0.1.2.3", true},
		{"224.0.0.1", true},
		{"239.255.255.250", true},
		{"255.255.255.255", true},
		{"240.0.0.1", true},
		{"192.0.2.1", true},
		{"198.18.0.1", true},
		{"198.51.100.1", true},
		{"203.0.113.1", true},
		{"192.0.0.170", true},
		{"::", true},
		{"::1", true},
		{"::127.0.0.1", true},
		{"::ffff:127.0.0.1", true},
		{"::ffff:8.8.8.8", true}, // mapped is refused outright
		{"64:ff9b::a01:203", true},
		{"2002:a01:203::1", true},
		{"2001::1", true},
		{"2001:db8::1", true},
		{"fc00::1", true},
		{"fd00:ec2::254", true},
		{"fe80::1", true},
		{"fe80::1%eth0", true},
		{"fec0::1", true},
		{"ff02::1", true},
	}
	for _, tt := range tests {
		a := netip.MustParseAddr(tt.addr)
		if got := addrBlocked(a, nil); got != tt.blocked {
			t.Errorf("addrBlocked(%s) = %v, want %v", tt.addr, got, tt.blocked)
		}
	}
	if !addrBlocked(netip.Addr{}, nil) {
		t.Error("the invalid address must be blocked")
	}
}

func TestAllowedPrivate(t *testing.T) {
	exempt := []netip.Prefix{
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("100.64.0.0/10"),
		netip.MustParsePrefix("fd00::/8"),
		netip.MustParsePrefix("::/0"),
	}
	tests := []struct {
		addr    string
		blocked bool
	}{
		{"127.0.0.1", false},
		{"10.1.2.3", false},
		{"169.254.77.77", false},
		{"192.168.1.1", true}, // not exempted
		// Never exemptable, whatever the list says.
		{"169.254.169.254", true},
		{"169.254.170.2", true},
		{"100.100.100.200", true},
		{"fd00:ec2::254", true},
		{"::ffff:127.0.0.1", true},
		{"fe80::1%eth0", true},
	}
	for _, tt := range tests {
		a := netip.MustParseAddr(tt.addr)
		if got := addrBlocked(a, exempt); got != tt.blocked {
			t.Errorf("addrBlocked(%s, exempt) = %v, want %v", tt.addr, got, tt.blocked)
		}
	}
}
