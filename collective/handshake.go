package collective

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// handshakeMagic opens every connection between ranks; the trailing byte is
// the protocol version: 1, or 2 where the hello carries flags (hello.Flags),
// which the acceptor answers with its own after its OK. A hello without
// flags is sent as version 1, byte for byte what ranks of earlier releases
// send and accept.
var (
	handshakeMagic      = [8]byte{'d', 't', 'c', 'o', 'l', 'l', 0, 1}
	handshakeMagicFlags = [8]byte{'d', 't', 'c', 'o', 'l', 'l', 0, 2}
)

const (
	maxRunLen        = 255
	nonceLen         = 32
	macLen           = sha256.Size
	handshakeTimeout = 10 * time.Second
	handshakeOK      = 0x6b // the acceptor's final byte: proof accepted
)

// hello is what the dialing rank sends first: who it is, whom it wants, and a fresh nonce.
type hello struct {
	Run        string
	Generation uint64
	From, To   uint32
	World      uint32
	// Flags are the dialer's choices that both ends of every link must share
	// (flagGatherLinks); the acceptor answers with its own after its OK.
	Flags byte
	Nonce [nonceLen]byte
}

// flagGatherLinks: the rank gathers small all-reduces over links to the
// ranks 2, 4, 8, ... away as well as the ring (skiplinks.go).
const flagGatherLinks = 1

// flagHostWindows: the rank reduces through host windows where every rank
// can map every other's (Options.HostWindows, windows.go).
const flagHostWindows = 2

// key routes an incoming connection to the Join waiting for it.
func (h hello) key() connKey {
	return connKey{run: h.Run, gen: h.Generation, from: h.From, to: h.To, world: h.World}
}

type connKey struct {
	run             string
	gen             uint64
	from, to, world uint32
}

func (h hello) encode() []byte {
	b := make([]byte, 0, 8+2+len(h.Run)+8+12+1+nonceLen)
	if h.Flags != 0 {
		b = append(b, handshakeMagicFlags[:]...)
	} else {
		b = append(b, handshakeMagic[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.Run)))
	b = append(b, h.Run...)
	b = binary.BigEndian.AppendUint64(b, h.Generation)
	b = binary.BigEndian.AppendUint32(b, h.From)
	b = binary.BigEndian.AppendUint32(b, h.To)
	b = binary.BigEndian.AppendUint32(b, h.World)
	if h.Flags != 0 {
		b = append(b, h.Flags)
	}
	return append(b, h.Nonce[:]...)
}

func readHello(r io.Reader) (hello, error) {
	var h hello
	var head [10]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return h, fmt.Errorf("reading handshake: %w", err)
	}
	withFlags := [8]byte(head[:8]) == handshakeMagicFlags
	if [8]byte(head[:8]) != handshakeMagic && !withFlags {
		return h, errors.New("not a durabletrain collective connection (bad magic or protocol version)")
	}
	n := int(binary.BigEndian.Uint16(head[8:]))
	if n == 0 || n > maxRunLen {
		return h, fmt.Errorf("handshake run name of %d bytes; want 1..%d", n, maxRunLen)
	}
	flagsLen := 0
	if withFlags {
		flagsLen = 1
	}
	rest := make([]byte, n+8+12+flagsLen+nonceLen)
	if _, err := io.ReadFull(r, rest); err != nil {
		return h, fmt.Errorf("reading handshake: %w", err)
	}
	h.Run = string(rest[:n])
	rest = rest[n:]
	h.Generation = binary.BigEndian.Uint64(rest)
	h.From = binary.BigEndian.Uint32(rest[8:])
	h.To = binary.BigEndian.Uint32(rest[12:])
	h.World = binary.BigEndian.Uint32(rest[16:])
	if withFlags {
		if h.Flags = rest[20]; h.Flags == 0 {
			return h, errors.New("handshake of protocol version 2 with no flags")
		}
	}
	copy(h.Nonce[:], rest[20+flagsLen:])
	return h, nil
}

// proof is HMAC-SHA256 over the role, the whole hello and the acceptor's nonce.
func proof(secret []byte, role string, h hello, acceptorNonce []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(role))
	m.Write(h.encode())
	m.Write(acceptorNonce)
	return m.Sum(nil)
}

// dialHandshake runs the dialer's side: send hello, check the acceptor's proof,
// send ours, wait for the acceptor's OK and flags, which it returns. It
// gives up when ctx ends.
func dialHandshake(ctx context.Context, conn net.Conn, secret []byte, h hello) (byte, error) {
	if _, err := rand.Read(h.Nonce[:]); err != nil {
		return 0, err
	}
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer func() {
		if stop() {
			conn.SetDeadline(time.Time{})
		}
	}()
	if _, err := conn.Write(h.encode()); err != nil {
		return 0, fmt.Errorf("sending handshake: %w", err)
	}
	var reply [nonceLen + macLen]byte
	if _, err := io.ReadFull(conn, reply[:]); err != nil {
		return 0, fmt.Errorf("reading handshake reply (the peer closed it: wrong secret, run, generation or release?): %w", err)
	}
	if !hmac.Equal(reply[nonceLen:], proof(secret, "accept", h, reply[:nonceLen])) {
		return 0, errAuth
	}
	if _, err := conn.Write(proof(secret, "dial", h, reply[:nonceLen])); err != nil {
		return 0, fmt.Errorf("sending handshake proof: %w", err)
	}
	ok := make([]byte, 1, 2)
	if h.Flags != 0 {
		ok = ok[:2] // the acceptor's flags follow its OK
	}
	if _, err := io.ReadFull(conn, ok); err != nil || ok[0] != handshakeOK {
		return 0, fmt.Errorf("peer refused our handshake proof: %w", errAuth)
	}
	if len(ok) == 2 {
		return ok[1], nil
	}
	return 0, nil
}

// acceptHandshake runs the acceptor's side on a connection whose hello was
// already read; flags are the acceptor's, sent after its OK to a hello
// with flags (one without them, of version 1, gets the OK alone).
func acceptHandshake(conn net.Conn, secret []byte, h hello, flags byte) error {
	var nonce [nonceLen]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return err
	}
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	if _, err := conn.Write(append(nonce[:], proof(secret, "accept", h, nonce[:])...)); err != nil {
		return fmt.Errorf("sending handshake reply: %w", err)
	}
	var got [macLen]byte
	if _, err := io.ReadFull(conn, got[:]); err != nil {
		return fmt.Errorf("reading handshake proof: %w", err)
	}
	if !hmac.Equal(got[:], proof(secret, "dial", h, nonce[:])) {
		return errAuth
	}
	answer := []byte{handshakeOK}
	if h.Flags != 0 {
		answer = append(answer, flags)
	}
	_, err := conn.Write(answer)
	return err
}

var errAuth = errors.New("authentication failed: the peer does not hold this run's secret")

// linkSecret is the key that authenticates the connection rank `from`
// dials to rank `to`, one of which is this rank (opts.Identity's). With a
// shared Secret it is that secret; with an Identity it is derived from the
// Diffie-Hellman secret of the two ranks, bound to the run, generation and
// direction, so a key of one link or gang proves nothing on another.
func linkSecret(gang Gang, rank, from, to int, opts Options) ([]byte, error) {
	if opts.Identity == nil {
		return opts.Secret, nil
	}
	if len(gang.PublicKeys) != len(gang.Peers) {
		return nil, fmt.Errorf("collective: gang.PublicKeys has %d keys for %d peers; want one per rank", len(gang.PublicKeys), len(gang.Peers))
	}
	if !bytes.Equal(gang.PublicKeys[rank], opts.Identity.PublicKey().Bytes()) {
		return nil, fmt.Errorf("collective: gang.PublicKeys[%d] is not this rank's public key (options.Identity)", rank)
	}
	peer := to
	if peer == rank {
		peer = from
	}
	pub, err := ecdh.X25519().NewPublicKey(gang.PublicKeys[peer])
	if err != nil {
		return nil, fmt.Errorf("collective: gang.PublicKeys[%d]: %w", peer, err)
	}
	shared, err := opts.Identity.ECDH(pub)
	if err != nil {
		return nil, fmt.Errorf("collective: key agreement with rank %d: %w", peer, err)
	}
	info := fmt.Appendf(nil, "durabletrain collective link v1\x00%s\x00%d\x00%d\x00%d", gang.Run, gang.Generation, from, to)
	return hkdf.Key(sha256.New, shared, nil, string(info), sha256.Size)
}
