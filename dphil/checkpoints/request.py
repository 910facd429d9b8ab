"""Running `dphil-ckpt-select`: choose the checkpoint(s), check, export or merge the adapter, draw, write."""

from __future__ import annotations

from dataclasses import dataclass

from dphil.checkpoints.record import located, read_inputs, with_adapter_path
from dphil.checkpoints.selection import select, summary
from dphil.io.console import Console, output_name
from dphil.io.errors import UsageError
from dphil.io.jsonl import RecordReader, RecordWriter


@dataclass(frozen=True)
class SelectRequest:
    """What `dphil-ckpt-select` was asked for (see commands/ckpt_select.py for the meaning of each option)."""

    inputs: tuple[str, ...] = ()  # files, or - for stdin; none: stdin
    by: str | None = None  # last, train or val [default: val if there are validation scores, else train]
    metric: str = "reward"
    smooth: int = 1
    rule: str = "best"  # best or one-se
    top: int = 1
    run: str | None = None  # select within this run only
    plot: str | None = None
    export_dir: str | None = None  # copy (or with merge: merge) the chosen adapter here
    merge: bool = False
    base_model: str | None = None  # with merge: the base weights' local copy
    check_path: bool = True  # the chosen adapter directory must exist
    output: str | None = None


def check_request(req: SelectRequest) -> None:
    """A UsageError (exit 64) for options that contradict each other, before anything is read."""
    if req.merge and req.export_dir is None:
        raise UsageError("--merge needs --export DIR (where to write the merged model)")
    if req.base_model is not None and not req.merge:
        raise UsageError("--base-model only applies with --merge")
    if req.export_dir is not None and req.top != 1:
        raise UsageError(f"--export writes one adapter; it cannot be combined with --top {req.top}")
    if req.export_dir is not None and not req.check_path:
        raise UsageError("--export always checks the adapter; drop --no-check-path")
    if req.plot is not None:
        from dphil.checkpoints.curve import check_plot_path

        check_plot_path(req.plot)


def run_select(req: SelectRequest, console: Console) -> int:
    """Choose from the inputs, hand the chosen record(s) on, say why on stderr; return the exit status."""
    check_request(req)
    reader = RecordReader(req.inputs)
    inputs = read_inputs(located(reader))
    selection = select(
        inputs,
        by=req.by,
        metric=req.metric,
        smooth=req.smooth,
        rule=req.rule,
        top=req.top,
        run=req.run,
    )
    for note in selection.notes:
        console.warn(note)
    # The adapter is looked for from where each record was read (its run directory, moved or
    # not), never from the working directory alone; the records written stay as read.
    if req.check_path:
        from dphil.checkpoints.export import adapter_dir

        for record in selection.chosen:
            if record.get("path") is not None or record.get("path_in_run") is not None:
                adapter_dir(with_adapter_path(inputs.checkpoints, record))
    if req.export_dir is not None:
        from dphil.checkpoints.export import export_adapter, merge_adapter

        record = selection.chosen[0]
        located_record = with_adapter_path(inputs.checkpoints, record)
        if req.merge:
            where = merge_adapter(located_record, req.export_dir, base_model=req.base_model)
            record["selection"]["merged_to"] = str(where)
        else:
            where = export_adapter(located_record, req.export_dir)
            record["selection"]["exported_to"] = str(where)
    if req.plot is not None:
        from dphil.checkpoints.curve import plot_selection

        plot_selection(selection, req.plot)
    with RecordWriter(req.output) as writer:
        for record in selection.chosen:
            writer.write(record)
    console.warn(summary(selection))
    console.report(f"wrote the chosen checkpoint record(s) to {output_name(req.output)}")
    return 0
