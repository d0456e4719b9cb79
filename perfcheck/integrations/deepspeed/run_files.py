"""The DeepSpeed files of a run directory, as the engine wrapper names them: their layout, reader and
writer live in ``perfcheck.rundir.deepspeed_files`` (the one reader of run files, below analysis/)."""
from perfcheck.rundir.deepspeed_files import (ADDED_ENGINE_STEP_COLUMNS, COMMS_COLUMNS, COMMS_CSV,  # noqa: F401
                                              ENGINE_STEP_COLUMNS, ENGINE_STEPS_CSV, ZERO_JSON, engine_steps_appender,
                                              read_comms, read_engine_steps, read_zero_json, write_comms,
                                              write_zero_json)
