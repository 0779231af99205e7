"""A small reader of Dockerfiles: enough to check them against the tree without Docker."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath


@dataclass
class Instruction:
    keyword: str
    args: list[str]
    exec_form: bool
    line: int


@dataclass
class Dockerfile:
    instructions: list[Instruction] = field(default_factory=list)

    def of(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def copies(self) -> list[tuple[str, str, int]]:
        """``(source, path in the image, line)`` for each source of each COPY/ADD from the
        build context (``--from`` stages are another image's files and are skipped)."""
        out = []
        workdir = PurePosixPath("/")
        for ins in self.instructions:
            if ins.keyword == "WORKDIR":
                workdir = workdir / ins.args[0]
            if ins.keyword not in ("COPY", "ADD"):
                continue
            flags = [a for a in ins.args if a.startswith("--")]
            if any(f.startswith("--from") for f in flags):
                continue
            *sources, dest = [a for a in ins.args if not a.startswith("--")]
            into_dir = dest.endswith("/") or dest in (".", "./") or len(sources) > 1
            for src in sources:
                target = workdir / dest / PurePosixPath(src).name if into_dir else workdir / dest
                out.append((src, str(target), ins.line))
        return out

    def workdir(self) -> PurePosixPath:
        w = PurePosixPath("/")
        for ins in self.of("WORKDIR"):
            w = w / ins.args[0]
        return w


def parse(text: str) -> Dockerfile:
    """Instructions with continuation lines joined and comments dropped."""
    df = Dockerfile()
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        keyword, _, rest = buf.partition(" ")
        rest = rest.strip()
        exec_form = rest.startswith("[")
        args = json.loads(rest) if exec_form else shlex.split(rest) if rest else []
        df.instructions.append(Instruction(keyword.upper(), args, exec_form, start))
        buf = ""
    assert not buf, "a Dockerfile ends inside a continued line"
    return df
