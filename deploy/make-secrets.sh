#!/bin/sh
# Writes what docker-compose.yml needs and does not ship: .env with random
# PostgreSQL and MinIO passwords, and deploy/secrets/pool.key (the workers'
# shared key: slot grants, checkpoint signatures) and codec.key (payload
# encryption; give it to whoever runs the starter or a codec server). Keeps
# what exists: run it again safely.
set -eu
cd "$(dirname "$0")/.."
umask 077
mkdir -p deploy/secrets
for key in pool codec; do
	f=deploy/secrets/$key.key
	[ -s "$f" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$f"
done
if [ ! -s .env ]; then
	printf 'POSTGRES_PASSWORD=%s\nMINIO_ROOT_PASSWORD=%s\n' \
		"$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
		"$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')" > .env
fi
echo "wrote .env and deploy/secrets/ (mode 600; keep them out of version control)"
