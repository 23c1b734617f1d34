"""Image references and pinning (kernel/images.py), the one definition the runner, the bot and the baselines use."""

from __future__ import annotations

import pytest

from kernel import images


@pytest.mark.parametrize(
    ("ref", "repository", "tag", "digest", "pinned"),
    [
        ("vllm/vllm-openai:v0.32.0", "vllm/vllm-openai", "v0.32.0", "", False),
        ("vllm/vllm-openai", "vllm/vllm-openai", "latest", "", False),
        ("registry:5000/vllm/vllm-openai", "registry:5000/vllm/vllm-openai", "latest", "", False),  # a port, no tag
        ("registry:5000/vllm:kimi@sha256:" + "a" * 64, "registry:5000/vllm", "kimi", "sha256:" + "a" * 64, True),
        ("vllm/vllm-openai@sha256:" + "b" * 64, "vllm/vllm-openai", "latest", "sha256:" + "b" * 64, True),
    ],
)
def test_a_reference_is_read_as_docker_reads_it(ref: str, repository: str, tag: str, digest: str, pinned: bool) -> None:
    assert (images.repository(ref), images.tag(ref), images.digest(ref), images.is_pinned(ref)) == (
        repository,
        tag,
        digest,
        pinned,
    )


def test_a_tag_is_pinned_by_its_repository_at_the_digest_and_a_pinned_reference_stays() -> None:
    digest = "sha256:" + "c" * 64
    assert (
        images.pinned_to("registry:5000/vllm/vllm-openai:kimi-k3", digest) == f"registry:5000/vllm/vllm-openai@{digest}"
    )
    assert images.pinned_to(f"vllm/vllm-openai:kimi-k3@{digest}", digest) == f"vllm/vllm-openai:kimi-k3@{digest}"
    other = "sha256:" + "d" * 64
    assert images.pinned_to(f"vllm/vllm-openai:kimi-k3@{digest}", other) == f"vllm/vllm-openai@{other}"
