package chaos

import (
	"fmt"
	"os/exec"
	"strings"
)

// hostNet makes each worker a host of its own: a network namespace with a
// veth link on a bridge, so a partition is a link taken down, not a firewall
// rule. The dev server listens on the bridge's address in the root namespace.
type hostNet struct {
	bridge string
	prefix string // 10.231.N
}

func (n hostNet) serverIP() string      { return n.prefix + ".1" }
func (n hostNet) ns(i int) string       { return fmt.Sprintf("dtc%d", i) }
func (n hostNet) hostLink(i int) string { return fmt.Sprintf("dtc%dh", i) }
func (n hostNet) ip(i int) string       { return fmt.Sprintf("%s.%d", n.prefix, 10+i) }

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setUp creates the bridge and hosts namespaces, removing leftovers of an
// earlier run first.
func (n hostNet) setUp(hosts int) error {
	n.tearDown(hosts + 8)
	steps := [][]string{
		{"link", "add", n.bridge, "type", "bridge"},
		{"addr", "add", n.serverIP() + "/24", "dev", n.bridge},
		{"link", "set", n.bridge, "up"},
	}
	for i := range hosts {
		steps = append(steps,
			[]string{"netns", "add", n.ns(i)},
			[]string{"link", "add", n.hostLink(i), "type", "veth", "peer", "name", "eth0", "netns", n.ns(i)},
			[]string{"link", "set", n.hostLink(i), "master", n.bridge, "up"},
			[]string{"-n", n.ns(i), "addr", "add", n.ip(i) + "/24", "dev", "eth0"},
			[]string{"-n", n.ns(i), "link", "set", "eth0", "up"},
			[]string{"-n", n.ns(i), "link", "set", "lo", "up"},
		)
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			n.tearDown(hosts)
			return err
		}
	}
	// Docker sets the FORWARD policy to DROP, and with br_netfilter that
	// applies to bridged traffic too: let the hosts' bridge forward.
	if _, err := exec.LookPath("iptables"); err == nil {
		if out, err := exec.Command("iptables", "-I", "FORWARD", "-i", n.bridge, "-o", n.bridge, "-j", "ACCEPT").CombinedOutput(); err != nil {
			n.tearDown(hosts)
			return fmt.Errorf("iptables: %v: %s", err, out)
		}
	}
	return nil
}

func (n hostNet) tearDown(hosts int) {
	for i := range hosts {
		exec.Command("ip", "netns", "del", n.ns(i)).Run()
		exec.Command("ip", "link", "del", n.hostLink(i)).Run()
	}
	exec.Command("ip", "link", "del", n.bridge).Run()
	for exec.Command("iptables", "-D", "FORWARD", "-i", n.bridge, "-o", n.bridge, "-j", "ACCEPT").Run() == nil {
	}
}

// partition cuts host i off from everyone (peers and Temporal), or heals it.
func (n hostNet) partition(i int, cut bool) error {
	state := "up"
	if cut {
		state = "down"
	}
	return ipCmd("link", "set", n.hostLink(i), state)
}

// Available says whether network namespaces can be made here, and why not.
func Available() error {
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("no ip command (iproute2): %v", err)
	}
	if err := ipCmd("netns", "add", "dtcprobe"); err != nil {
		return fmt.Errorf("cannot make network namespaces (root is needed): %v", err)
	}
	exec.Command("ip", "netns", "del", "dtcprobe").Run()
	return nil
}
