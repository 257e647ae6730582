"""A registry reference as a fleet file gives it: HOST[:PORT]/REPOSITORY[:TAG][@sha256:HEX].

The grammar is distribution/reference's (docs/modelkit-formats.md §7) with one rule of our
own: the registry host is required. Docker's tools put a bare `repo:tag` on Docker Hub and
KitOps' `kit` on `localhost`; a daemon that reads months-old fleet files should not guess
between them, so `check` asks for the host. Only sha256 digests are taken (what every
registry and KitOps write). Pure: text in, Reference or ReferenceError out.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace

from supervisor.errors import SpecfleetError

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*"
                   r"[A-Za-z0-9])?)*(?::[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?$")
MAX_NAME = 255
FORM = "HOST[:PORT]/REPOSITORY[:TAG][@sha256:DIGEST], e.g. registry.example.com/ns/model:v1"


class ReferenceError(SpecfleetError):
    pass


@dataclass(frozen=True)
class Reference:
    host: str  # with its port, as written: "registry.example.com", "127.0.0.1:5000"
    repository: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        return (f"{self.host}/{self.repository}" + (f":{self.tag}" if self.tag else "")
                + (f"@{self.digest}" if self.digest else ""))

    @property
    def version(self) -> str:
        """What the manifest is asked for by: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def pinned(self, digest: str) -> Reference:
        """The same name and tag, resolved to `digest` (what a run record keeps)."""
        return replace(self, digest=digest)

    @property
    def base_url(self) -> str:
        """The registry's API root: plain HTTP for a loopback registry (a registry:2 on the
        box itself), HTTPS for any other."""
        scheme = "http" if _loopback(self.host) else "https"
        return f"{scheme}://{self.host}/v2/{self.repository}"


def _loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:host.index("]")]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def parse(text: str) -> Reference:
    """The reference `text` names; ReferenceError saying what is wrong and what is valid."""
    given = text.strip()
    rest, at, after = given.partition("@")
    digest = after if at else None
    host, slash, path = rest.partition("/")
    if not slash or not (("." in host or ":" in host or host == "localhost")
                         and _HOST.match(host)):
        raise ReferenceError(f"{text!r} names no registry host: expected {FORM}")
    repository, tag = path, None
    head, _, last = path.rpartition("/")
    if ":" in last:  # the tag follows the last path component
        name, _, tag = last.partition(":")
        repository = f"{head}/{name}" if head else name
    if not _REPOSITORY.match(repository) or len(host) + 1 + len(repository) > MAX_NAME:
        raise ReferenceError(f"{text!r}: repository {repository!r} is not valid (lowercase "
                             f"letters, digits and . _ - between them, / between parts); "
                             f"expected {FORM}")
    if tag is not None and not _TAG.match(tag):
        raise ReferenceError(f"{text!r}: tag {tag!r} is not valid (letters, digits, _ . -, "
                             f"at most 128, not starting with . or -)")
    if digest is not None and not _DIGEST.match(digest):
        raise ReferenceError(f"{text!r}: digest {digest!r} is not valid: expected sha256: and "
                             "64 lowercase hex digits")
    return Reference(host, repository, tag, digest)
