"""Image references and their pinning, one definition for the runner, the bot and the baselines: a reference is
`[registry[:port]/]path[:tag][@digest]`; it is pinned when it names a sha256 digest, and a tag is pinned by
launching its repository (the name without the tag) at the digest, `repository@sha256:…`, since a tag can move."""

from __future__ import annotations

PINNED_MARK = "@sha256:"


def is_pinned(ref: str) -> bool:
    """Whether the reference names the image by its sha256 digest (launching it always gets the same image)."""
    return PINNED_MARK in ref


def digest(ref: str) -> str:
    """The digest a reference names ("sha256:…"); "" for a reference by tag only."""
    return ref.partition("@")[2]


def _name(ref: str) -> str:
    return ref.partition("@")[0]


def repository(ref: str) -> str:
    """The repository, without tag or digest (a registry's port is no tag: only the last component has one)."""
    name = _name(ref)
    return name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name


def tag(ref: str) -> str:
    """The tag the reference names; "latest" when it names none, as Docker reads it."""
    name = _name(ref)
    return name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"


def pinned_to(ref: str, image_digest: str) -> str:
    """The reference that launches `image_digest`: `ref` itself when it names that digest already, else its
    repository at the digest."""
    return ref if digest(ref) == image_digest else f"{repository(ref)}@{image_digest}"
