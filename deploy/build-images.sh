#!/usr/bin/env bash
# Builds the image durabletrain:local (or $TAG) FROM scratch: worker (with
# OpenBLAS), starter and devserver, the shared libraries they link, and the
# Fashion-MNIST files. No registry is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${TAG:-durabletrain:local}
go=${GO:-go}
work=.durabletrain/image
rootfs=$work/rootfs
rm -rf "$work"
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
