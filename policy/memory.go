package policy

import (
	"os"
	"strconv"
	"strings"
)

// RankMemory is the memory one rank may take: MaxRankMemory if set, else
// half of what the worker may use (its cgroup's memory.max, or the
// machine's memory) shared among its slots.
func (p Policy) RankMemory(slots int) int64 {
	if p.MaxRankMemory > 0 {
		return p.MaxRankMemory
	}
	return max(1, workerMemory()/2/int64(max(1, slots)))
}

// DatasetMemory is the memory one data set's examples may take:
// MaxDatasetMemory if set, else a quarter of what the worker may use (its
// cgroup's memory.max, or the machine's memory). The worker keeps up to
// two data sets per slot, but those its ranks train on at once are what
// must fit beside their models (RankMemory, half the worker's).
func (p Policy) DatasetMemory() int64 {
	if p.MaxDatasetMemory > 0 {
		return p.MaxDatasetMemory
	}
	return max(1, workerMemory()/4)
}

// workerMemory is what this process may use: the cgroup v2 limit if there
// is one, else the machine's memory.
func workerMemory() int64 {
	total := int64(0)
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				total = kb << 10
			}
		}
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 && (total == 0 || v < total) {
			return v
		}
	}
	if total == 0 {
		return 8 << 30 // nothing to read: assume a small machine
	}
	return total
}
