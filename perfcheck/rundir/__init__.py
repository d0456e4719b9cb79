"""The run directory: the one reader (and writer) of the files a run leaves, below every folder that
reads them (predict, measure, analysis, report, integrations, commands).

One module per job: ``layout`` (file names, tables, directory names), ``writer`` (atomic writes,
appended CSVs), ``lock`` (one run per directory), ``summary`` (modules.csv from the per-step rows),
``files`` (reading one file safely), ``reader`` (``load_run``: ranks checked and merged) and
``deepspeed_files`` (zero.json, comms.csv, engine_steps.csv). The names below are re-exported so
callers write ``from perfcheck import rundir`` and ``rundir.load_run(...)``.
"""
from perfcheck.rundir.files import (MAX_JSON_BYTES, TEXT_COLUMNS, as_saved, check_cells, csv_data,  # noqa: F401
                                    decode_text, inside, parse_csv, parse_json_text, read_bytes, read_json,
                                    read_table, read_text, read_versioned_json)
from perfcheck.rundir.layout import (META, MODULE_STEP_COLUMNS, TABLES, TRACE, check_run_dir,  # noqa: F401
                                     new_run_dir, rank_dir)
from perfcheck.rundir.lock import LOCK, RunLock  # noqa: F401
from perfcheck.rundir.reader import MAX_WORLD_SIZE, Run, check_meta, load_run  # noqa: F401
from perfcheck.rundir.summary import summarize_module_steps  # noqa: F401
from perfcheck.rundir.writer import (CsvAppender, atomic_copy, atomic_write_bytes, atomic_write_csv,  # noqa: F401
                                     atomic_write_json, atomic_write_text, clean_stale_temps, with_added_columns)
