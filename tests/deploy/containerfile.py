"""A small reader of Dockerfile instructions, for tests that check what an image runs and exposes.

It knows what Dockerfile syntax needs for that: comments, backslash continuations, JSON (exec) form
arguments, KEY=VALUE words, and stages (FROM ... AS name) that inherit their parent stage's settings.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path


class ContainerfileError(ValueError):
    """An instruction this reader cannot make sense of, named by file and line."""


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str  # upper case: FROM, RUN, ENV...
    text: str  # the arguments, continuations joined

    def words(self) -> list[str]:
        """The arguments as a list: JSON (exec) form when the text is a JSON array, else shell words."""
        if self.text.startswith("["):
            try:
                parsed = json.loads(self.text)
            except ValueError as exc:
                raise ContainerfileError(
                    f"line {self.line}: {self.keyword}: not a JSON array: {exc}"
                ) from None
            if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
                raise ContainerfileError(
                    f"line {self.line}: {self.keyword}: expected a JSON array of strings"
                )
            return parsed
        return shlex.split(self.text)


@dataclass
class Stage:
    name: str
    base: str  # the image or earlier stage it starts FROM
    parent: Stage | None  # that earlier stage, when it is one
    instructions: list[Instruction] = field(default_factory=list)

    def chain(self) -> list[Stage]:
        """This stage and those it starts from, the first base first."""
        return [*(self.parent.chain() if self.parent else []), self]

    def last(self, keyword: str) -> Instruction | None:
        """The setting in force for a single-valued instruction (ENTRYPOINT, CMD, USER), inherited too."""
        found = [i for stage in self.chain() for i in stage.instructions if i.keyword == keyword]
        return found[-1] if found else None

    def all(self, keyword: str) -> list[Instruction]:
        """Every instruction of this kind in force in this stage, inherited ones first."""
        return [i for stage in self.chain() for i in stage.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        """The ENV variables this stage runs with (KEY=VALUE words; `$PATH` left as written)."""
        return dict(word.split("=", 1) for i in self.all("ENV") for word in i.words())


def read_instructions(path: Path) -> list[Instruction]:
    """The file's instructions in order, each with the line it starts on."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = number
        continued = stripped.endswith("\\")
        pending.append(stripped[:-1].strip() if continued else stripped)
        if continued:
            continue
        keyword, _, text = " ".join(part for part in pending if part).partition(" ")
        if not keyword.isalpha():
            raise ContainerfileError(f"{path}:{start}: expected an instruction, got {raw!r}")
        instructions.append(Instruction(start, keyword.upper(), text.strip()))
        pending = []
    if pending:
        raise ContainerfileError(f"{path}:{start}: the file ends inside a continued instruction")
    return instructions


def read_stages(path: Path) -> dict[str, Stage]:
    """The file's stages by name (a stage without AS is named by its index), in order."""
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for instruction in read_instructions(path):
        if instruction.keyword == "FROM":
            words = instruction.text.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            current = stages[name] = Stage(name, words[0], stages.get(words[0]))
        elif current is None:
            if instruction.keyword != "ARG":
                raise ContainerfileError(f"{path}:{instruction.line}: {instruction.keyword} before FROM")
        else:
            current.instructions.append(instruction)
    return stages
