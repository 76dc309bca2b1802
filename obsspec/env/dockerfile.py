"""Reading Dockerfiles: instructions, and BuildKit heredocs translated for older builders.

    for ins in instructions(text):                    # logical instructions, heredoc bodies attached
        print(ins.keyword, ins.args)
    text, files = translate_heredocs(text)           # what buildah 1.28 (Debian 12's podman) can build

BuildKit reads here-documents in RUN, COPY and ADD (`RUN cat <<'EOF' > f` ... `EOF`, also with
blanks after `<<` or a descriptor before it, as its lexer reads them); Debian 12's
podman 4.3.1 (buildah 1.28) cannot parse them: the body lines are read as instructions and the
build fails. `translate_heredocs` rewrites each such instruction into one the old parser reads,
with the meaning BuildKit gives it (moby/buildkit, dockerfile2llb `dispatchRun`):

- `RUN <<EOF` (the heredoc is the whole command): its body runs as the script of the stage's
  SHELL (default `/bin/sh -c`); a body starting with `#!` is written to a file and executed, so
  its interpreter runs it.
- any other RUN with heredocs (`RUN cat <<'EOF' > f`, `RUN python3 <<EOF`, several heredocs):
  the command line, then each body and its terminator line, go to the SHELL as one script, so
  the shell itself applies quoted / unquoted delimiters (expansion or not) and `<<-` (leading
  tabs removed).
  Both become exec-form RUNs (`RUN ["/bin/sh", "-c", "<script>"]`, JSON keeps every newline);
  the instruction's flags (`--mount=...`, `--network=...`) stay in front.
- `COPY <<EOF /dest` and `ADD <<EOF /dest`: each body becomes a file of the build context (named
  after its delimiter, as BuildKit names it) copied with the same flags. An unquoted delimiter
  whose body holds `$` would be expanded by BuildKit with the build's ARG and ENV values, which
  only BuildKit's own lexer reproduces: that is `Untranslatable` (the task is skipped, with that
  reason).

A Dockerfile without heredocs is returned unchanged, byte for byte.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

HEREDOC_INSTRUCTIONS = ("RUN", "COPY", "ADD")
CONTEXT_DIR = ".obsspec-heredoc"  # where COPY/ADD heredoc bodies go in the build context
_DIRECTIVE = re.compile(r"#\s*([A-Za-z]+)\s*=\s*(\S+)\s*$")


class Untranslatable(ValueError):
    """A Dockerfile construct this module cannot give BuildKit's meaning (one line, why)."""


@dataclass
class Heredoc:
    name: str          # the delimiter word, without quotes
    quoted: bool       # `<<'EOF'` / `<<"EOF"`: no expansion
    strip_tabs: bool   # `<<-EOF`
    lines: list[str] = field(default_factory=list)  # body lines, raw, each with its newline
    end: str = ""      # the terminator line, raw (with its newline, if any)

    def body(self) -> str:
        """The content as the shell gives it to the command (leading tabs gone for `<<-`)."""
        return "".join(line.lstrip("\t") if self.strip_tabs else line for line in self.lines)


@dataclass
class Instruction:
    keyword: str                 # upper case, e.g. 'RUN' ('' for blank and comment lines)
    args: str                    # the logical line after the keyword, continuations joined
    raw: str                     # the exact source text, heredoc bodies included
    heredocs: list[Heredoc] = field(default_factory=list)


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's lines grouped into instructions (blank and comment lines as their own
    entries with keyword ''), each heredoc's body attached to the instruction that opened it."""
    lines = text.splitlines(keepends=True)
    out: list[Instruction] = []
    escape = "\\"
    i = 0
    in_directives = True
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if in_directives:
            m = _DIRECTIVE.match(stripped)
            if m and m.group(1).lower() == "escape":
                escape = m.group(2)[:1] or "\\"
            in_directives = bool(m)
        if not stripped or stripped.startswith("#"):
            out.append(Instruction("", "", line))
            i += 1
            continue
        raw, parts = [line], []
        current = line
        i += 1
        # A line ending in the escape character continues; comment lines inside are dropped
        # from the logical line (as Docker does) but kept in the raw text.
        while True:
            body = current.rstrip("\r\n")
            if body.rstrip().endswith(escape) and i < len(lines):
                parts.append(body.rstrip()[:-1])
                while i < len(lines) and lines[i].strip().startswith("#"):
                    raw.append(lines[i])
                    i += 1
                if i >= len(lines):
                    break
                current = lines[i]
                raw.append(current)
                i += 1
                continue
            parts.append(body)
            break
        logical = "".join(parts).strip()
        word, _, args = logical.partition(" ")
        keyword = word.upper()
        ins = Instruction(keyword, args.strip(), "".join(raw))
        if keyword in HEREDOC_INSTRUCTIONS:
            for name, quoted, strip in _heredoc_words(ins.args):
                doc = Heredoc(name, quoted, strip)
                while i < len(lines):
                    candidate = lines[i]
                    i += 1
                    check = candidate.rstrip("\r\n")
                    if (check.lstrip("\t") if strip else check) == name:
                        doc.end = candidate
                        break
                    doc.lines.append(candidate)
                else:
                    raise Untranslatable(f"{keyword} heredoc <<{name} has no terminator line {name!r}")
                ins.heredocs.append(doc)
                ins.raw += "".join(doc.lines) + doc.end
        out.append(ins)
    return out


def _heredoc_words(args: str) -> list[tuple[str, bool, bool]]:
    """(name, quoted, strip_tabs) of every word of `args` that opens a heredoc, in order, as
    BuildKit's parser finds them: a word `[N]<<[-][ ]WORD` outside quotes (not `<<<`; BuildKit's
    lexer keeps the blanks after `<<` in the word, so `<< 'EOF'` opens one)."""
    found = []
    for word in _words(args):
        m = re.fullmatch(r"(\d*)<<(-?)\s*([^<]+)", word, re.S)
        if not m:
            continue
        rest = m.group(3)
        name = re.sub(r"""(?<!\\)['"]""", "", rest).replace("\\'", "'").replace('\\"', '"')
        if name and not any(c.isspace() for c in name):
            found.append((name, name != rest, m.group(2) == "-"))
    return found


def _words(text: str) -> list[str]:
    """Shell-like words (quotes kept, not interpreted), enough to find heredoc openers; the
    blanks after an unquoted `<<` stay in its word, as in BuildKit's lexer."""
    words, word, quote = [], "", ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            word += ch
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            word += ch
            quote = ch
        elif ch == "<" and text.startswith("<<", i) and not text.startswith("<<<", i):
            word += "<<"
            i += 2
            if i < len(text) and text[i] == "-":
                word += "-"
                i += 1
            while i < len(text) and text[i] in " \t":
                word += text[i]
                i += 1
            continue
        elif ch.isspace():
            if word:
                words.append(word)
            word = ""
        else:
            word += ch
        i += 1
    if word:
        words.append(word)
    return words


def has_heredocs(text: str) -> bool:
    try:
        return any(ins.heredocs for ins in instructions(text))
    except Untranslatable:
        return True


# ---------------------------------------------------------------------------------------------
# Translation


def translate_heredocs(text: str) -> tuple[str, dict[str, str]]:
    """(Dockerfile without heredocs, files to add to the build context); see the module
    docstring. Raises Untranslatable for what it cannot express faithfully."""
    parsed = instructions(text)
    if not any(ins.heredocs for ins in parsed):
        return text, {}
    out, files = [], {}
    shell = ["/bin/sh", "-c"]
    for ins in parsed:
        if ins.keyword == "FROM":
            shell = ["/bin/sh", "-c"]  # each stage starts with the default SHELL
        elif ins.keyword == "SHELL":
            try:
                shell = json.loads(ins.args)
            except ValueError:
                raise Untranslatable(f"SHELL {ins.args} is not a JSON array") from None
        if not ins.heredocs:
            out.append(ins.raw)
            continue
        flags, command = _split_flags(ins.args)
        if ins.keyword == "RUN":
            out.append(f"RUN {flags}{json.dumps([*shell, _run_script(command, ins.heredocs)])}\n")
        else:
            sources = []
            for doc in ins.heredocs:
                if not doc.quoted and "$" in doc.body():
                    raise Untranslatable(f"{ins.keyword} <<{doc.name} with an unquoted delimiter and "
                                         f"'$' in its body needs BuildKit's build-time expansion")
                rel = f"{CONTEXT_DIR}/{len(files)}/{doc.name}"
                files[rel] = doc.body()
                sources.append(rel)
            rest = [w for w in _words(command) if not re.match(r"\d*<<", w)]
            if not rest:
                raise Untranslatable(f"{ins.keyword} heredoc without a destination")
            out.append(f"{ins.keyword} {flags}{json.dumps([*sources, *rest])}\n")
    return "".join(out), files


def _split_flags(args: str) -> tuple[str, str]:
    """('--flag=x --other ', 'rest') of an instruction's arguments."""
    flags = ""
    rest = args
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        flags += word + " "
        rest = rest.lstrip()
    return flags, rest


def _run_script(command: str, heredocs: list[Heredoc]) -> str:
    """The script BuildKit gives the shell for a RUN with heredocs."""
    only = len(_words(command)) == 1 and re.fullmatch(r"\d*<<-?\s*\S+", command.strip())
    if only and len(heredocs) == 1:
        body = heredocs[0].body()
        if not body.startswith("#!"):
            return body
        # a script with its own interpreter: written to a file and executed, as BuildKit does
        end = "OBSSPEC_HEREDOC_END"
        while end in body:
            end += "_"
        return (f"f=$(mktemp) && cat > \"$f\" <<'{end}'\n{body}{end}\n"
                f"chmod +x \"$f\" && \"$f\"; status=$?; rm -f \"$f\"; exit $status\n")
    return command + "\n" + "".join("".join(doc.lines) + doc.end.rstrip("\r\n") + "\n" for doc in heredocs)


# ---------------------------------------------------------------------------------------------
# What other modules read from a Dockerfile


def from_lines(text: str) -> list[tuple[str, str]]:
    """(base, stage name or '') of every FROM instruction, in order."""
    found = []
    for ins in instructions(text):
        if ins.keyword == "FROM":
            args = [w for w in ins.args.split() if not w.startswith("--")]
            if args:
                stage = args[2] if len(args) >= 3 and args[1].upper() == "AS" else ""
                found.append((args[0], stage))
    return found
