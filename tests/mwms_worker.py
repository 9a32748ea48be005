"""One worker of a 2-worker MultiWorkerMirroredStrategy run (see
multi_worker_test.py, which starts two of these as separate processes).

Usage: python mwms_worker.py INDEX PORT0,PORT1 SCENARIO[+SCENARIO...] WORKDIR

Prints one line `RESULT {json}` with this worker's state after training (for
several scenarios, a JSON object of their results by name).
"""

import faulthandler
import json
import os
import sys

# Last-resort watchdog: a hung collective must not outlive the test.
faulthandler.dump_traceback_later(150, exit=True)

INDEX = int(sys.argv[1])
PORTS = sys.argv[2].split(",")
SCENARIO = sys.argv[3]
WORKDIR = sys.argv[4]
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": [f"127.0.0.1:{p}" for p in PORTS]},
    "task": {"type": "worker", "index": INDEX},
})
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import mwms_training  # noqa: E402


def main():
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=mwms_training.COLLECTIVE_TIMEOUT_SECONDS
        )
    )
    if "+" not in SCENARIO:
        result = mwms_training.SCENARIOS[SCENARIO](strategy, WORKDIR)
    else:  # One after another, each in a directory of its own.
        result = {}
        for name in SCENARIO.split("+"):
            workdir = os.path.join(WORKDIR, name)
            os.makedirs(workdir, exist_ok=True)
            result[name] = mwms_training.SCENARIOS[name](strategy, workdir)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
