"""The worker's AES-256-GCM payload codec, from Python (codec/codec.go is the
other implementation; the two read each other's payloads).

A deployment whose starters and workers run with ``-codec-key-file F``
keeps every payload in Temporal history encrypted (specs with their
exec.env values and URLs, progress, checkpoint references). A Python
driver given the same file (``durabletrain.init(codec_key_file=F)`` or
$DURABLETRAIN_CODEC_KEY_FILE) starts and reads such runs.

Example:
    >>> import os, tempfile
    >>> f = os.path.join(tempfile.mkdtemp(), "key")
    >>> fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o600); _ = os.write(fd, b"k" * 32); os.close(fd)
    >>> codec = PayloadCodec.from_key_file(f)
    >>> len(codec.key_id)
    16
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Iterable, List, Sequence

from temporalio.api.common.v1 import Payload
import temporalio.converter

ENCODING = b"binary/encrypted"
CIPHER = b"AES-256-GCM"
MIN_KEY_BYTES = 32
NONCE_BYTES = 12


def read_key_file(path: str, what: str = "codec_key_file") -> bytes:
    """The key in the file, as the Go side reads it: its owner's alone,
    at most 64 KiB, at least 32 bytes after trailing whitespace."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("%s: %s is not a regular file" % (what, path))
    if st.st_mode & 0o077:
        raise ValueError("%s: %s can be read by others (mode %04o); want it readable by its owner only: chmod 600 %s" % (
            what, path, st.st_mode & 0o777, path))
    if st.st_size > 64 << 10:
        raise ValueError("%s: %s has %d bytes; a key file holds at most 64 KiB" % (what, path, st.st_size))
    with open(path, "rb") as f:
        key = f.read().rstrip(b" \t\r\n")
    if len(key) < MIN_KEY_BYTES:
        raise ValueError("%s: %s holds %d bytes; want at least %d (openssl rand -hex 32 > %s)" % (what, path, len(key), MIN_KEY_BYTES, path))
    return key


class PayloadCodec(temporalio.converter.PayloadCodec):
    """Encrypts with the first key; decrypts payloads of any key given
    (rotation); passes payloads never encrypted through."""

    def __init__(self, secret: bytes, *older: bytes) -> None:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
        self._keys = {}
        self.key_id = ""
        for i, k in enumerate((secret,) + older):
            if len(k) < MIN_KEY_BYTES:
                raise ValueError("codec key of %d bytes; want at least %d" % (len(k), MIN_KEY_BYTES))
            key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"durabletrain payload codec v1").derive(k)
            kid = hashlib.sha256(b"durabletrain payload codec key id\x00" + k).hexdigest()[:16]
            self._keys[kid] = AESGCM(key)
            if i == 0:
                self.key_id = kid

    @classmethod
    def from_key_file(cls, path: str, *older: str) -> "PayloadCodec":
        return cls(read_key_file(path), *(read_key_file(p) for p in older))

    async def encode(self, payloads: Sequence[Payload]) -> List[Payload]:
        out = []
        aead = self._keys[self.key_id]
        for p in payloads:
            nonce = os.urandom(NONCE_BYTES)
            sealed = aead.encrypt(nonce, p.SerializeToString(), self.key_id.encode())
            out.append(Payload(metadata={"encoding": ENCODING, "encryption-key-id": self.key_id.encode(), "encryption-cipher": CIPHER},
                               data=nonce + sealed))
        return out

    async def decode(self, payloads: Sequence[Payload]) -> List[Payload]:
        out = []
        for p in payloads:
            if p.metadata.get("encoding") != ENCODING:
                out.append(p)
                continue
            kid = p.metadata.get("encryption-key-id", b"").decode()
            aead = self._keys.get(kid)
            if aead is None:
                raise ValueError("codec: payload encrypted with key %s; this process has key %s" % (kid, self.key_id))
            if p.metadata.get("encryption-cipher") != CIPHER:
                raise ValueError("codec: payload cipher %r; want %r" % (p.metadata.get("encryption-cipher"), CIPHER))
            if len(p.data) < NONCE_BYTES + 16:
                raise ValueError("codec: encrypted payload of %d bytes is too short" % len(p.data))
            try:
                plain = aead.decrypt(p.data[:NONCE_BYTES], p.data[NONCE_BYTES:], kid.encode())
            except Exception:
                raise ValueError("codec: encrypted payload does not authenticate with key %s: altered or damaged" % kid) from None
            dec = Payload()
            dec.ParseFromString(plain)
            out.append(dec)
        return out


def data_converter(codec: PayloadCodec) -> temporalio.converter.DataConverter:
    import dataclasses
    return dataclasses.replace(temporalio.converter.DataConverter.default, payload_codec=codec)
