"""The sim engine's prefix cache: what a replica served before is cached, as vLLM's and
llama-server's KV caches keep it.

A prompt's tokens are cut into blocks of ``block`` tokens; each full block is known by a
hash of its tokens and of every block before it, so a block hits only when the whole
prefix up to it was served. ``lookup`` says how many leading tokens of a prompt are
cached (whole blocks, and never the prompt's last token, which an engine computes
again for its logits, as vLLM does); ``store`` keeps a sequence's blocks (a request's
prompt as it starts, its prompt and answer as it ends). The cache holds at most
``capacity`` tokens, the least recently used block going first; of one sequence the
last block counts as the least recent, as vLLM frees a sequence's blocks tail first, so
a shared prefix outlives the turns that follow it.

Standard library only; no Django.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from agent.simtext import token_id

BLOCK = 16


class PrefixCache:
    """A bounded LRU of prompt-prefix blocks (the module's docstring)."""

    def __init__(self, capacity: int, block: int = BLOCK) -> None:
        self.block = max(1, block)
        self.capacity_blocks = max(0, capacity) // self.block
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    def __len__(self) -> int:
        return len(self._blocks)

    def _hashes(self, pieces: Sequence[str], limit: int) -> list[bytes]:
        """The chained hashes of the first ``limit`` full blocks of ``pieces``."""
        out: list[bytes] = []
        previous = b""
        for start in range(0, min(limit, len(pieces) // self.block) * self.block, self.block):
            digest = hashlib.blake2b(previous, digest_size=16)
            for piece in pieces[start : start + self.block]:
                digest.update(token_id(piece).to_bytes(4, "big"))
            previous = digest.digest()
            out.append(previous)
        return out

    def lookup(self, pieces: Sequence[str]) -> int:
        """How many leading tokens of a prompt are cached (a multiple of the block, less
        than the prompt's length); the blocks that hit become the most recently used."""
        if not self.enabled or len(pieces) < 2:
            return 0
        hits: list[bytes] = []
        for digest in self._hashes(pieces, (len(pieces) - 1) // self.block):
            if digest not in self._blocks:
                break
            hits.append(digest)
        for digest in reversed(hits):
            self._blocks.move_to_end(digest)
        return len(hits) * self.block

    def store(self, pieces: Sequence[str]) -> None:
        """Keep every full block of a sequence, evicting the least recently used past the
        capacity."""
        if not self.enabled:
            return
        for digest in reversed(self._hashes(pieces, len(pieces) // self.block)):
            self._blocks[digest] = None
            self._blocks.move_to_end(digest)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
