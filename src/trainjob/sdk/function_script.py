"""An SDK ``CustomTrainer``'s function as the program every rank runs (both backends run this script).

The script holds the function's source (checked and stripped of decorators by
:func:`trainjob.sdk.trainer_checks.function_source`) and calls it with ``**func_args`` decoded from a JSON literal;
nothing passes through a shell. It imports :data:`~trainjob.sdk.trainer_checks.SCRIPT_IMPORTS` first (training
functions often use ``os`` and ``sys`` unimported), and ends the process without interpreter teardown once the
function returned. An exception the function raises is recorded in ``TORCHELASTIC_ERROR_FILE`` as torchelastic's
``@record`` would (without importing torch for it), so torchrun reports it as the rank's error and the job's
status names it. The generated script is compiled before the job is created::

    script = function_script(train, {"epochs": 2})
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from trainjob.errors import ValidationError
from trainjob.sdk.trainer_checks import RECORD_ERROR_FUNCTION, SCRIPT_IMPORTS, function_source

SCRIPT_NAME = "train_function.py"

#: Writes what torchelastic's ``@record`` writes for an exception (``ErrorHandler.record_exception``).
_RECORD_ERROR = f'''
def {RECORD_ERROR_FUNCTION}(exc):
    """Record exc where torchrun looks for a failed rank's error, in torchelastic's error file format."""
    import time, traceback
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    message = {{"message": f"{{type(exc).__name__}}: {{exc}}",
               "extraInfo": {{"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}}}}
    with open(path, "w") as f:
        json.dump({{"message": message}}, f)
'''


def function_script(func: Any, func_args: dict[str, Any] | None) -> str:
    """Python source that defines ``func`` and calls it with ``func_args``."""
    source = function_source(func)
    name = source.name
    args = dict(func_args or {})
    try:
        inspect.signature(func).bind(**args)
    except TypeError as exc:
        raise ValidationError("trainer.func_args", f"do not match {name}{inspect.signature(func)}: {exc}") from None
    try:
        encoded = json.dumps(args)
    except (TypeError, ValueError) as exc:
        raise ValidationError("trainer.func_args", f"must be JSON-serializable: {exc}") from None
    imports = "".join(f"import {module}\n" for module in SCRIPT_IMPORTS)
    script = (
        f'"""Runs {name}(**func_args) in every training process of the job."""\n\n'
        f"{imports}\n"
        f"{source.text}\n\n"
        f"{_RECORD_ERROR}\n\n"
        'if __name__ == "__main__":\n'
        "    try:\n"
        f"        {name}(**json.loads({encoded!r}))\n"
        "    except Exception as exc:\n"
        f"        {RECORD_ERROR_FUNCTION}(exc)\n"
        "        raise\n"
        "    # Exit handlers run, interpreter teardown does not: on CPU, gloo's background threads can abort a\n"
        "    # process (SIGABRT) while Python finalizes after the work is done, failing a finished job.\n"
        "    atexit._run_exitfuncs()\n"
        "    sys.stdout.flush()\n"
        "    sys.stderr.flush()\n"
        "    os._exit(0)\n"
    )
    try:
        compile(script, SCRIPT_NAME, "exec")
    except SyntaxError as exc:
        raise ValidationError("trainer.func", f"the script made from its source does not compile: {exc}") from None
    return script
