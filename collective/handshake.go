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

// handshakeMagic opens every connection between ranks; the trailing byte is the protocol version.
var handshakeMagic = [8]byte{'d', 't', 'c', 'o', 'l', 'l', 0, 1}

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
	Nonce      [nonceLen]byte
}

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
	b := make([]byte, 0, 8+2+len(h.Run)+8+12+nonceLen)
	b = append(b, handshakeMagic[:]...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.Run)))
	b = append(b, h.Run...)
	b = binary.BigEndian.AppendUint64(b, h.Generation)
	b = binary.BigEndian.AppendUint32(b, h.From)
	b = binary.BigEndian.AppendUint32(b, h.To)
	b = binary.BigEndian.AppendUint32(b, h.World)
	return append(b, h.Nonce[:]...)
}

func readHello(r io.Reader) (hello, error) {
	var h hello
	var head [10]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return h, fmt.Errorf("reading handshake: %w", err)
	}
	if [8]byte(head[:8]) != handshakeMagic {
		return h, errors.New("not a durabletrain collective connection (bad magic or protocol version)")
	}
	n := int(binary.BigEndian.Uint16(head[8:]))
	if n == 0 || n > maxRunLen {
		return h, fmt.Errorf("handshake run name of %d bytes; want 1..%d", n, maxRunLen)
	}
	rest := make([]byte, n+8+12+nonceLen)
	if _, err := io.ReadFull(r, rest); err != nil {
		return h, fmt.Errorf("reading handshake: %w", err)
	}
	h.Run = string(rest[:n])
	rest = rest[n:]
	h.Generation = binary.BigEndian.Uint64(rest)
	h.From = binary.BigEndian.Uint32(rest[8:])
	h.To = binary.BigEndian.Uint32(rest[12:])
	h.World = binary.BigEndian.Uint32(rest[16:])
	copy(h.Nonce[:], rest[20:])
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
// send ours, wait for the acceptor's OK. It gives up when ctx ends.
func dialHandshake(ctx context.Context, conn net.Conn, secret []byte, h hello) error {
	if _, err := rand.Read(h.Nonce[:]); err != nil {
		return err
	}
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer func() {
		if stop() {
			conn.SetDeadline(time.Time{})
		}
	}()
	if _, err := conn.Write(h.encode()); err != nil {
		return fmt.Errorf("sending handshake: %w", err)
	}
	var reply [nonceLen + macLen]byte
	if _, err := io.ReadFull(conn, reply[:]); err != nil {
		return fmt.Errorf("reading handshake reply (the peer closed it: wrong secret, run or generation?): %w", err)
	}
	if !hmac.Equal(reply[nonceLen:], proof(secret, "accept", h, reply[:nonceLen])) {
		return errAuth
	}
	if _, err := conn.Write(proof(secret, "dial", h, reply[:nonceLen])); err != nil {
		return fmt.Errorf("sending handshake proof: %w", err)
	}
	var ok [1]byte
	if _, err := io.ReadFull(conn, ok[:]); err != nil || ok[0] != handshakeOK {
		return fmt.Errorf("peer refused our handshake proof: %w", errAuth)
	}
	return nil
}

// acceptHandshake runs the acceptor's side on a connection whose hello was already read.
func acceptHandshake(conn net.Conn, secret []byte, h hello) error {
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
	_, err := conn.Write([]byte{handshakeOK})
	return err
}

var errAuth = errors.New("authentication failed: the peer does not hold this run's secret")

// linkSecrets are the keys that authenticate this rank's two connections:
// the one it dials (to right) and the one it accepts (from left). With a
// shared Secret both are that secret; with an Identity each is derived from
// the Diffie-Hellman secret of the two ranks, bound to the run, generation
// and direction, so a key of one link or gang proves nothing on another.
func linkSecrets(gang Gang, rank, left, right int, opts Options) (dial, accept []byte, err error) {
	if opts.Identity == nil {
		return opts.Secret, opts.Secret, nil
	}
	if len(gang.PublicKeys) != len(gang.Peers) {
		return nil, nil, fmt.Errorf("collective: gang.PublicKeys has %d keys for %d peers; want one per rank", len(gang.PublicKeys), len(gang.Peers))
	}
	if !bytes.Equal(gang.PublicKeys[rank], opts.Identity.PublicKey().Bytes()) {
		return nil, nil, fmt.Errorf("collective: gang.PublicKeys[%d] is not this rank's public key (options.Identity)", rank)
	}
	link := func(from, to, peer int) ([]byte, error) {
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
	if dial, err = link(rank, right, right); err != nil {
		return nil, nil, err
	}
	if accept, err = link(left, rank, left); err != nil {
		return nil, nil, err
	}
	return dial, accept, nil
}
