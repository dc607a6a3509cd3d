"""nanoasr models: list, describe, download and remove model packages.

Results go to stdout, download progress and errors to stderr. Exit status as in nanoasr.cli.
"""
from __future__ import annotations

import argparse
import json

from nanoasr.cli import EXIT_FAILED, EXIT_OK, error
from nanoasr.errors import NanoasrError

PROG = "nanoasr models"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="{list,info,download,remove}")
    listing = commands.add_parser("list", help="known packages, their size and whether they are downloaded")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    name_help = "package name or hub id org/repo[@revision][:quant]"
    for command, help_text in (("info", "what a package is and where its files are"),
                               ("download", "download a package (check sizes and sha256)"),
                               ("remove", "delete a package's downloaded files")):
        sub = commands.add_parser(command, help=help_text)
        if command == "remove":
            sub.add_argument("name", help=name_help)
        else:
            sub.add_argument("name", nargs="?", default=None,
                             help=name_help + " (default: the default package)")
        sub.add_argument("--revision", default=None,
                         help="hub revision (branch, tag or commit) instead of the pinned one")
        sub.add_argument("--local-dir", default=None,
                         help="a plain directory instead of the Hugging Face cache")
        if command == "info":
            sub.add_argument("--json", action="store_true", help="machine-readable output")
        if command == "download":
            sub.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def human_size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def row_size(row: dict) -> str:
    """A package's size: exact where its files' sizes are known or here, else the recorded estimate."""
    if row["size"] is None and row["approx_size"] is not None:
        return "~" + human_size(row["approx_size"])
    return human_size(row["size"])


def cmd_list(args) -> int:
    from nanoasr import hub

    rows = [hub.info(p.name) for p in hub.list_packages()]
    if args.json:
        print(json.dumps(rows, indent=1, ensure_ascii=False))
        return EXIT_OK
    table = [("NAME", "FORMAT", "SIZE", "CACHED", "REPO@REVISION", "LICENSE")]
    table += [(r["name"], r["format"], row_size(r), "yes" if r["cached"] else "no",
               f"{r['repo']}@{r['revision'][:12]}", r["license"]) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    print(f"\ndefault: {hub.default_package().name}; cache: {hub.cache_dir()}")
    return EXIT_OK


def cmd_info(args) -> int:
    from nanoasr import hub

    row = hub.info(args.name, revision=args.revision, local_dir=args.local_dir)
    if args.json:
        print(json.dumps(row, indent=1, ensure_ascii=False))
        return EXIT_OK
    for key in ("name", "description", "format", "repo", "revision", "size", "license", "license_url"):
        value = row_size(row) if key == "size" else row[key]
        if value:
            print(f"{key + ':':<13}{value}")
    for f in row["files"]:
        print(f"{'file:':<13}{f['name']}  {human_size(f['size'])}  sha256 {f['sha256'] or 'not recorded'}")
    print(f"{'downloaded:':<13}{row['path'] or 'no; ' + row['download']}")
    return EXIT_OK


def cmd_download(args) -> int:
    from nanoasr import hub

    resolved = hub.download(args.name, revision=args.revision, local_dir=args.local_dir,
                            progress=not args.quiet)
    print(resolved.path)
    return EXIT_OK


def cmd_remove(args) -> int:
    from nanoasr import hub

    freed = hub.remove(args.name, revision=args.revision, local_dir=args.local_dir)
    print(f"removed {args.name}: {human_size(freed)} freed")
    return EXIT_OK


COMMANDS = {"list": cmd_list, "info": cmd_info, "download": cmd_download, "remove": cmd_remove}


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except NanoasrError as exc:
        error(PROG, exc)
        return EXIT_FAILED
