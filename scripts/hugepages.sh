#!/usr/bin/env bash
# Runs a command with the kernel's transparent huge pages set to "always",
# and puts the setting back when the command ends. A cold `make test` starts
# the Go compiler and linker hundreds of times, and each touches fresh
# memory: with 4 KiB pages every touch is a page fault, and in some VMs
# faults are dear. On a 2-core PVM guest (2026-11-28), `go build std` from an
# empty build cache took 57-67 s with "madvise" (31-36 s of it in the kernel)
# and 41-49 s with "always" (19-21 s), six runs alternating. Only as root,
# only where the setting can be written; DURABLETRAIN_THP=keep leaves it.
set -uo pipefail
f=/sys/kernel/mm/transparent_hugepage/enabled
was=$(grep -o '\[[a-z]*\]' "$f" 2>/dev/null | tr -d '[]')
if [ "${DURABLETRAIN_THP:-}" != keep ] && [ -n "$was" ] && [ "$was" != always ] && [ "$(id -u)" -eq 0 ] &&
  { echo always > "$f"; } 2>/dev/null; then
  trap 'echo "$was" > "$f"' EXIT
  trap 'exit 130' INT TERM
  echo "hugepages: transparent huge pages are \"always\" until this command ends (they were \"$was\"; DURABLETRAIN_THP=keep leaves them)" >&2
fi
"$@"
