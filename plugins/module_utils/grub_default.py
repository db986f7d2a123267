# Copyright: stethoscope developers
# Apache License 2.0
"""The kernel command line assignments of /etc/default/grub, read as the shell that sources the file
reads them, and edited so that the inverse edit gives back the original bytes.

Which variable is edited, by layout:
- the file assigns GRUB_CMDLINE_LINUX_DEFAULT (Debian, Ubuntu, Arch, openSUSE, Azure Linux, Fedora
  with both): its last assignment (the one the shell keeps); it applies to the normal boot entries,
  not to recovery ones;
- only GRUB_CMDLINE_LINUX (RHEL, CentOS, Rocky, Alma, Fedora as Anaconda writes it): its last
  assignment, so no GRUB_CMDLINE_LINUX_DEFAULT line is added to a file that never had one;
- neither: one GRUB_CMDLINE_LINUX_DEFAULT line is appended, and restore removes exactly that line.
Over several files (/etc/default/grub, then the /etc/default/grub.d/*.cfg Debian's grub-mkconfig
sources after it, where Ubuntu cloud images set the command line) the file holding the winning
assignment is the one edited.

Values may be double-quoted (with backslash escapes), single-quoted, unquoted or empty, may refer to
other variables (`$GRUB_CMDLINE_LINUX_DEFAULT`, `${GRUB_CMDLINE_LINUX}`: kept as written, expanded
from earlier assignments when read; other names read as empty) and may be followed by a comment.
What cannot be edited safely (command substitution, line continuation, a quote closed on a later
line, parameter expansion with operators, words after the value, an indented or compound
assignment) is a GrubDefaultError naming the file and the line."""

from __future__ import annotations

import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

LINUX = "GRUB_CMDLINE_LINUX"
LINUX_DEFAULT = "GRUB_CMDLINE_LINUX_DEFAULT"
CMDLINE_NAMES = (LINUX, LINUX_DEFAULT)
ENCODING = "utf-8"
ERRORS = "surrogateescape"  # undecodable bytes in comments survive a round trip unchanged

ASSIGNMENT = re.compile(r"(?P<indent>[ \t]*)(?:export[ \t]+)?(?P<name>GRUB_CMDLINE_LINUX(?:_DEFAULT)?)=")
ANYWHERE = re.compile(r"(?<![A-Za-z0-9_])GRUB_CMDLINE_LINUX(?:_DEFAULT)?\+?=")
APPEND = re.compile(r"[ \t]*(?:export[ \t]+)?GRUB_CMDLINE_LINUX(?:_DEFAULT)?\+=")
# the shell's compound commands: an assignment inside one may or may not apply
BLOCK_OPENS = ("if", "case", "for", "while", "until")
BLOCK_CLOSES = ("fi", "esac", "done")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SAFE_UNQUOTED = re.compile(r"[A-Za-z0-9_.,:=/+@%-]+\Z")
WORD_END = " \t;&|<>()"
SPECIAL_PARAMETERS = tuple("*@#?-$!0123456789")


class GrubDefaultError(ParseError):
    """/etc/default/grub holds something this editor cannot read or change safely."""


class Assignment:
    """One `NAME=value` of a kernel command line variable: where its value token lies in the text,
    the token as written and the value the shell assigns."""

    def __init__(self, name, line_no, start, end, token, value, closing_part=None):
        self.name = name
        self.line_no = line_no
        self.start = start
        self.end = end
        self.token = token
        self.value = value
        self.closing_part = closing_part  # where the quoted part that ends the token opens, if one does


def decode(data):
    return data.decode(ENCODING, ERRORS)


def encode(text):
    return text.encode(ENCODING, ERRORS)


def _lines(text):
    """(line number, offset of the line, line without its newline)."""
    offset = 0
    for number, line in enumerate(text.split("\n"), start=1):
        yield number, offset, line
        offset += len(line) + 1


def assignments(text, path="/etc/default/grub", values=None):
    """Every assignment of GRUB_CMDLINE_LINUX and GRUB_CMDLINE_LINUX_DEFAULT, in file order, with the
    value the shell gives it at that point; `values` carries what files sourced earlier assigned."""
    found = []
    values = {} if values is None else values
    depth = 0
    for line_no, offset, line in _lines(text):
        if line.endswith("\r"):
            raise GrubDefaultError(path, "a line ends with a carriage return (a DOS file)", line_no, line)
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        first = line.split(None, 1)[0].rstrip(";")
        depth += (first in BLOCK_OPENS) - (first in BLOCK_CLOSES)
        if APPEND.match(line):
            raise GrubDefaultError(
                path, "an append (+=): its value depends on what ran before", line_no, line
            )
        match = ASSIGNMENT.match(line)
        if match and depth > 0 and not match.group("indent"):
            raise GrubDefaultError(
                path, "an assignment inside if/case/a loop: cannot tell whether it applies", line_no, line
            )
        if not match:
            if ANYWHERE.search(line):
                raise GrubDefaultError(
                    path, "a kernel command line set inside a compound line", line_no, line
                )
            continue
        if match.group("indent"):
            raise GrubDefaultError(
                path,
                "an indented assignment (inside a block?): cannot tell whether it applies",
                line_no,
                line,
            )
        start = match.end()
        end, value, quoted_from = _read_word(line, start, values, path, line_no)
        _expect_line_end(line, end, path, line_no)
        name = match.group("name")
        values[name] = value
        closing_part = quoted_from - start if quoted_from is not None else None
        found.append(
            Assignment(name, line_no, offset + start, offset + end, line[start:end], value, closing_part)
        )
    return found


def _read_word(line, pos, values, path, line_no):
    """(end, value, where a quoted part ending the word opens or None) of the shell word at pos."""
    parts, quoted_from, quoted_to = [], None, None
    while pos < len(line) and line[pos] not in WORD_END:
        char = line[pos]
        if char in "'\"":
            quoted_from = pos
        if char == "'":
            close = line.find("'", pos + 1)
            if close < 0:
                raise GrubDefaultError(path, "a single quote not closed on its line", line_no, line)
            parts.append(line[pos + 1 : close])
            pos = quoted_to = close + 1
        elif char == '"':
            pos = quoted_to = _read_double_quoted(line, pos + 1, parts, values, path, line_no)
        elif char == "\\":
            if pos + 1 >= len(line):
                raise GrubDefaultError(path, "a line continuation", line_no, line)
            parts.append(line[pos + 1])
            pos += 2
        elif char == "$":
            if line[pos + 1 : pos + 2] in ("'", '"'):
                raise GrubDefaultError(path, "$'...' or $\"...\" quoting", line_no, line)
            pos = _read_reference(line, pos, parts, values, path, line_no)
        elif char == "`":
            raise GrubDefaultError(path, "a command substitution", line_no, line)
        elif char == "~":
            raise GrubDefaultError(path, "an unquoted ~ (tilde expansion)", line_no, line)
        else:
            parts.append(char)
            pos += 1
    return pos, "".join(parts), quoted_from if quoted_to == pos else None


def _read_double_quoted(line, pos, parts, values, path, line_no):
    while pos < len(line):
        char = line[pos]
        if char == '"':
            return pos + 1
        if char == "\\":
            if pos + 1 >= len(line):
                raise GrubDefaultError(path, "a line continuation", line_no, line)
            following = line[pos + 1]
            parts.append(following if following in '$`"\\' else char + following)
            pos += 2
        elif char == "$":
            pos = _read_reference(line, pos, parts, values, path, line_no)
        elif char == "`":
            raise GrubDefaultError(path, "a command substitution", line_no, line)
        else:
            parts.append(char)
            pos += 1
    raise GrubDefaultError(path, "a double quote not closed on its line", line_no, line)


def _read_reference(line, pos, parts, values, path, line_no):
    """`$NAME` or `${NAME}`, expanded from the assignments read so far (other names read as empty);
    a `$` that starts no expansion is literal, as in the shell."""
    rest = line[pos + 1 :]
    if rest.startswith("("):
        raise GrubDefaultError(path, "a command substitution", line_no, line)
    braced = re.match(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", rest)
    plain = NAME.match(rest)
    match, name = (braced, braced.group(1)) if braced else (plain, plain.group(0) if plain else None)
    if rest.startswith("{") and not braced:
        raise GrubDefaultError(path, "a parameter expansion other than ${NAME}", line_no, line)
    if name == "_" or rest[:1] in SPECIAL_PARAMETERS:
        raise GrubDefaultError(path, "a special parameter ($%s)" % (name or rest[:1]), line_no, line)
    if match:
        parts.append(values.get(name, ""))
        return pos + 1 + match.end()
    parts.append("$")
    return pos + 1


def _expect_line_end(line, end, path, line_no):
    rest = line[end:].lstrip(" \t")
    if rest and not rest.startswith("#"):
        raise GrubDefaultError(path, "words after the value (%r)" % rest[:40], line_no, line)


# reading ----------------------------------------------------------------------------------------
def value_of(found, name):
    """What the shell holds in `name` once the file is sourced ("" when never assigned)."""
    last = [a for a in found if a.name == name]
    return last[-1].value if last else ""


def kernel_args(found):
    """The arguments a normal boot entry gets from the file: GRUB_CMDLINE_LINUX, then _DEFAULT."""
    return (value_of(found, LINUX) + " " + value_of(found, LINUX_DEFAULT)).split()


def edited_variable(found):
    """The layout rule of this module's docstring."""
    names = {a.name for a in found}
    return LINUX_DEFAULT if LINUX_DEFAULT in names or LINUX not in names else LINUX


# editing ----------------------------------------------------------------------------------------
def add_args(text, args, path="/etc/default/grub"):
    """(new text, edit record) adding the arguments of `args` the file's default boot entry lacks;
    (text, None) when it has them all. The record is what `remove_args` needs to undo the edit."""
    planned = add_args_to_files([(path, text)], args)
    return (text, None) if planned is None else (planned[1], planned[2])


def add_args_to_files(sources, args):
    """`add_args` over the files grub-mkconfig sources, in its order ([(path, text)]: /etc/default/grub,
    then /etc/default/grub.d/*.cfg): the edit goes to the file holding the assignment that wins.
    (path, new text, record) or None when nothing is missing."""
    for arg in args:
        if not SAFE_UNQUOTED.match(arg):
            raise ValueError("kernel argument %r needs quoting" % arg)
    parsed = _parse_all(sources)
    found = [a for _path, _text, assigned in parsed for a in assigned]
    missing = [arg for arg in args if arg not in kernel_args(found)]
    if not missing:
        return None
    name = edited_variable(found)
    holders = [entry for entry in parsed if any(a.name == name for a in entry[2])]
    path, text, assigned = holders[-1] if holders else parsed[0]
    record = {"variable": name, "added": missing, "before": value_of(found, name), "file": path}
    targets = [a for a in assigned if a.name == name]
    if targets:
        target = targets[-1]
        edited = _appended_token(target, " ".join(missing))
        new_text = text[: target.start] + edited + text[target.end :]
        record.update(line=target.line_no, original=target.token, edited=edited)
    else:
        suffix = ("\n" if text and not text.endswith("\n") else "") + '%s="%s"\n' % (name, " ".join(missing))
        new_text = text + suffix
        record.update(appended=suffix)
    edited_sources = [(p, new_text if p == path else t) for p, t in sources]
    record["after"] = value_of([a for entry in _parse_all(edited_sources) for a in entry[2]], name)
    return path, new_text, record


def _parse_all(sources):
    values = {}
    return [(path, text, assignments(text, path, values)) for path, text in sources]


def values_in_files(sources):
    """Every assignment over the files, in the order they are sourced (for `value_of`)."""
    return [a for _path, _text, assigned in _parse_all(sources) for a in assigned]


def _appended_token(target, args):
    """The value token with `args` at its end, in the token's own quoting."""
    token = target.token
    if not token:
        return '"%s"' % args
    if target.closing_part is not None:
        inner = token[target.closing_part + 1 : -1]
        separator = "" if not inner or inner[-1] in " \t" else " "
        return token[:-1] + separator + args + token[-1]
    if SAFE_UNQUOTED.match(token):
        return '"%s %s"' % (token, args)
    return token + '" %s"' % args


def remove_args(text, record, path="/etc/default/grub"):
    """The text with `add_args`'s edit undone: the original token back where the edited one still
    stands (byte-exact), the appended line removed; where the value changed since, only the added
    arguments are taken out of it."""
    appended = record.get("appended")
    if appended:
        if text.endswith(appended):
            return text[: -len(appended)]
        line = re.compile("^" + re.escape(appended.strip("\n")) + "\n", re.M)
        if line.search(text):
            return line.sub("", text, count=1)
    found = [a for a in assignments(text, path) if a.name == record["variable"]]
    if not found:
        return text
    target = found[-1]
    if record.get("edited") is not None and target.token == record["edited"]:
        replacement = record["original"]
    else:
        replacement = _without_args(target.token, record.get("added") or [])
    return text[: target.start] + replacement + text[target.end :]


def _without_args(token, args):
    for arg in args:
        word = re.escape(arg)
        after = r"(?=[ \t\"']|\Z)"
        token, count = re.subn(r"[ \t]+" + word + after, "", token, count=1)
        if not count:
            token = re.sub(r"(?:(?<=^)|(?<=[\"']))" + word + r"(?:[ \t]+|" + after + ")", "", token, count=1)
    return token
