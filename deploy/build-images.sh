#!/usr/bin/env bash
# Builds the image durabletrain:local (or $TAG) FROM scratch: worker (with
# OpenBLAS), starter and devserver, the shared libraries they link, and the
# Fashion-MNIST files; with PYTORCH=1 also durabletrain-pytorch:local (see
# below). No registry is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${TAG:-durabletrain:local}
go=${GO:-go}
work=.durabletrain/image-$(printf %s "$tag" | tr -c "A-Za-z0-9._-" "-")  # one per tag: builds of two tags may run at once
rootfs=$work/rootfs
rm -rf "$work" "$work-pytorch"
trap 'rm -rf "$work" "$work-pytorch"' EXIT # the images hold the root filesystems
mkdir -p "$rootfs/usr/local/bin" "$rootfs/tmp" "$rootfs/var/lib/durabletrain/checkpoints" "$rootfs/data" "$rootfs/usr/share/datasets"
chmod 1777 "$rootfs/tmp"
mkdir -p "$rootfs/etc" "$rootfs/root"
echo 'root:x:0:0:root:/root:/nonexistent' > "$rootfs/etc/passwd"
echo 'root:x:0:' > "$rootfs/etc/group"

echo "images: building worker, starter and devserver (devserver compiles the Temporal server: minutes when cold)"
"$go" build -tags "${TAGS:-openblas}" -o "$rootfs/usr/local/bin/worker" ./cmd/worker
"$go" build -o "$rootfs/usr/local/bin/starter" ./cmd/starter
"$go" build -o "$rootfs/usr/local/bin/devserver" ./cmd/devserver

# The shared libraries the cgo binaries link, at the paths the loader looks for them.
for bin in "$rootfs"/usr/local/bin/*; do
  ldd "$bin" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' || true
done | sort -u | while read -r lib; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done

data=/usr/share/datasets/fashion-mnist
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
  echo "images: $data is missing: run make deps (Debian's dataset-fashion-mnist)" >&2
  exit 1
fi
cp -rL "$data" "$rootfs/usr/share/datasets/"

cp deploy/Dockerfile "$work/Dockerfile"
docker build -q -t "$tag" "$work" >/dev/null 2>"$work/build.log" || { cat "$work/build.log" >&2; exit 1; }
echo "images: built $tag ($(du -sh "$rootfs" | cut -f1) root filesystem)"

# PYTORCH=1 also builds durabletrain-pytorch:local (or $TAG_PYTORCH), for
# exec runs in containers: the same binaries, plus Python and PyTorch as
# Debian packages them (python3-torch and everything it depends on,
# recursively, copied from this machine's installed packages: no pip, no
# registry), the durabletrain Python module where the worker looks for it
# (/usr/local/python) and the PyTorch example.
if [ "${PYTORCH:-0}" = 1 ]; then
  tag_py=${TAG_PYTORCH:-durabletrain-pytorch:local}
  if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
    echo "images: /usr/bin/python3 cannot import torch: run make deps-test (Debian's python3-torch)" >&2
    exit 1
  fi
  pywork=$work-pytorch
  rm -rf "$pywork"
  mkdir -p "$pywork"
  cp -a "$rootfs" "$pywork/rootfs"
  # Debian's merged /usr: /lib, /lib64, /bin and /sbin are links into /usr.
  for l in lib lib64 bin sbin; do
    mkdir -p "$pywork/rootfs/usr/$l"
    if [ -L "/$l" ] && [ ! -e "$pywork/rootfs/$l" ]; then
      ln -s "usr/$l" "$pywork/rootfs/$l"
    fi
  done
  pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances \
    python3-torch python3 2>/dev/null | grep -v '^ ' | sort -u)
  for pkg in $pkgs; do
    dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q 'install ok installed' || continue
    dpkg -L "$pkg" 2>/dev/null
  done | grep -vE '^/usr/share/(doc|man|locale|info|lintian)/' | grep -vE '^/(bin|sbin|lib|lib32|lib64|libx32|usr|\.)?$' |
    sed -E 's#^/(bin|sbin|lib|lib32|lib64|libx32)/#/usr/\1/#' | sort -u > "$pywork/files"
  # One tar of every listed path (directories without their other contents).
  tar --no-recursion --ignore-failed-read -C / -cf - -T "$pywork/files" 2>/dev/null | tar -C "$pywork/rootfs" -xf -
  # What Python's extension modules link that no package lists as its own
  # file (Debian's alternatives, such as libblas.so.3), where the loader looks.
  { find "$pywork/rootfs/usr/lib/python3" "$pywork/rootfs/usr/bin" -type f \( -name '*.so*' -o -name 'python3*' \) -print0 2>/dev/null |
      xargs -0 ldd 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    if [ ! -e "$pywork/rootfs$lib" ]; then
      mkdir -p "$pywork/rootfs$(dirname "$lib")"
      cp -L "$lib" "$pywork/rootfs$lib"
    fi
  done
  mkdir -p "$pywork/rootfs/usr/local/python" "$pywork/rootfs/usr/local/share/durabletrain/examples/pytorch"
  cp -r python/durabletrain "$pywork/rootfs/usr/local/python/"
  cp examples/pytorch/train.py examples/pytorch/compose.json "$pywork/rootfs/usr/local/share/durabletrain/examples/pytorch/"
  # Python and torch must run in it as they run here.
  cp deploy/Dockerfile "$pywork/Dockerfile"
  docker build -q -t "$tag_py" "$pywork" >/dev/null 2>"$pywork/build.log" || { cat "$pywork/build.log" >&2; exit 1; }
  docker run --rm -e PYTHONPATH=/usr/local/python --entrypoint /usr/bin/python3 "$tag_py" -c "import torch, durabletrain; print('images: torch', torch.__version__)" ||
    { echo "images: python3 cannot import torch in $tag_py" >&2; exit 1; }
  echo "images: built $tag_py ($(du -sh "$pywork/rootfs" | cut -f1) root filesystem)"
fi
