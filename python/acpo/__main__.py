"""`python -m acpo score FILE.jsonl`: every line's answer judged against its gold answer;
`python -m acpo track RUN_DIR --to wandb|tensorboard|mlflow [--follow]`: a run into a tracker
(acpo.track).

Each line of FILE (`-` for standard input) is a JSON object with the gold answer (`gold`, or
`--gold-key`) and the response (`answer`, or `--answer-key`); every other field is kept. Each
line is written back (standard output, or `--output`) with the verdict added: `correct`,
`extracted`, `source`, `error`; the accuracy goes to standard error. A line that is not such an
object, or a field of the wrong type, is an error naming the line and the field (exit 2), before
anything is judged or written.
"""
import argparse
import json
import math
import os
import sys
import tempfile

from . import MAX_BATCH, judge_batch

USAGE_ERROR = 2


class InputError(Exception):
    pass


def _records(lines, where, gold_key, answer_key):
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(records) >= MAX_BATCH:
            raise InputError(f"{where}: more than {MAX_BATCH} lines: split the file")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where}:{n}: not JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise InputError(f"{where}:{n}: a JSON object is expected, not {type(record).__name__}")
        for key, kinds, what in ((gold_key, (str, int, float), "str or a number"), (answer_key, (str,), "str")):
            if key not in record:
                raise InputError(f"{where}:{n}: no field {key!r} (fields: {', '.join(map(repr, record)) or 'none'})")
            if not isinstance(record[key], kinds) or isinstance(record[key], bool):
                raise InputError(f"{where}:{n}: field {key!r} must be {what}, not {type(record[key]).__name__}")
        if isinstance(record[gold_key], float) and not math.isfinite(record[gold_key]):
            raise InputError(f"{where}:{n}: field {gold_key!r} is {record[gold_key]}, which no answer can equal")
        records.append(record)
    return records


def score(args):
    where = "<stdin>" if args.file == "-" else args.file
    try:
        if args.file == "-":
            records = _records(sys.stdin, where, args.gold_key, args.answer_key)
        else:
            with open(args.file, encoding="utf-8") as f:
                records = _records(f, where, args.gold_key, args.answer_key)
    except OSError as e:
        raise InputError(f"{where}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        verdicts = judge_batch([r[args.gold_key] for r in records], [r[args.answer_key] for r in records])
    except (TypeError, ValueError) as e:
        raise InputError(f"{where}: {e}") from None
    out = []
    for record, v in zip(records, verdicts):
        record.update(correct=v.correct, extracted=v.extracted, source=v.source, error=v.error)
        out.append(json.dumps(record, ensure_ascii=False) + "\n")
    text = "".join(out)
    if args.output:
        # staged beside the target and renamed over it: a failed write leaves no half file
        folder = os.path.dirname(os.path.abspath(args.output))
        fd, staged = tempfile.mkstemp(prefix=".acpo-score-", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(staged, args.output)
        except BaseException:
            os.unlink(staged)
            raise
    else:
        sys.stdout.write(text)
    correct = sum(v.correct for v in verdicts)
    share = f"{correct / len(verdicts):.4f}" if verdicts else "n/a"
    print(f"acpo score: {correct} of {len(verdicts)} correct (accuracy {share})", file=sys.stderr)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m acpo", description="acpo's math answer verifier, and runs into trackers")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("score", help="judge the answers of a JSONL file against their gold answers")
    p.add_argument("file", help="a JSONL file, one object per line ('-': standard input)")
    p.add_argument("--gold-key", default="gold", help="the field of the gold answer (default: gold)")
    p.add_argument("--answer-key", default="answer", help="the field of the response (default: answer)")
    p.add_argument("--output", "-o", help="write the judged lines here instead of standard output")
    from . import track

    track.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "track":
            return track.main(args)
        score(args)
    except (InputError, track.TrackError) as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
