#!/usr/bin/env bash
# Installs the Debian packages durabletrain's demo, tests and benchmarks use,
# when they are missing. Safe to run again; needs root (or sudo) to install.
#   scripts/deps.sh            what the demo needs
#   scripts/deps.sh test       also PyTorch, torchvision and venv, for the exec backend's and the Python package's tests
#                              (and Prometheus, whose promtool and server test the alert rules and dashboard,
#                              and Chromium, in which Playwright drives the Web UI)
#   scripts/deps.sh bench      also the peers the benchmarks compare against
set -euo pipefail
need=(libopenblas-dev dataset-fashion-mnist)
case "${1:-}" in
  test) need+=(python3-torch python3-torchvision python3-venv prometheus chromium fonts-liberation) ;;
  bench) need+=(python3-torch python3-torchvision libopenblas0-openmp openmpi-bin libopenmpi-dev awscli) ;;
esac
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps: please install as root: apt-get install ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
