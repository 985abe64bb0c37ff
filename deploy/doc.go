// Package deploy owns how durabletrain is deployed with Docker: the image
// built FROM scratch out of our own binaries (build-images.sh, Dockerfile),
// docker-compose.yml (official Temporal, PostgreSQL and MinIO images around
// ours) and docker-compose.local.yml (only images built here). Its test
// brings the local deployment up and trains across its containers.
package deploy
