"""What the live keys page's Key box finds: a key, whole, or one that holds the words typed.

Words, not any substring: "1001" finds ledger:1001 and 1001/refund but not ledger:21001, so that an
id finds its keys and no others; "ledger 1001" finds ledger:1001 (a separator typed stands for any,
as in the task list's search). Case-sensitive, as keys are in the gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ...gate import MAX_KEY_LENGTH
from ...gate.listing import glob_escape
from ...records.key_words import words


@dataclass(frozen=True)
class KeyFragment:
    typed: str

    @cached_property
    def words(self) -> list[str]:
        # Longer than any key: it matches none, and is not sent to Redis.
        return words(self.typed) if len(self.typed) <= MAX_KEY_LENGTH else []

    @property
    def exact_key(self) -> str | None:
        """The text as typed, if it can be a key (looked up whole, whatever its words)."""
        return self.typed if 0 < len(self.typed) <= MAX_KEY_LENGTH else None

    @property
    def glob(self) -> str | None:
        """A ``MATCH`` pattern that every key :meth:`matches` matches (Redis filters, this checks); None if
        only the exact key can match."""
        return "*" + "*".join(glob_escape(word) for word in self.words) + "*" if self.words else None

    def matches(self, key: str) -> bool:
        """``key`` is the text typed, or its words hold the fragment's words, in a row."""
        if key == self.typed:
            return True
        wanted, have = self.words, words(key)
        if not wanted:
            return False
        return any(have[i : i + len(wanted)] == wanted for i in range(len(have) - len(wanted) + 1))
