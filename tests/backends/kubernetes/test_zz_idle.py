import os, time, sys
sys.path.insert(0, "benchmarks")
from reconcile_kwok import TrainJobOperator

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

def test_idle(k8s):
    k8s.operator.stop()
    for label, env in [("first", {}), ("again", {}), ("arena2", {"MALLOC_ARENA_MAX": "2"}), ("again", {})]:
        saved = dict(os.environ)
        os.environ.update(env)
        op = TrainJobOperator(k8s, 4)
        pid = op.start()
        os.environ.clear(); os.environ.update(saved)
        time.sleep(8)
        st = open(f"/proc/{pid}/status").read()
        print("\n", label, [l for l in st.splitlines() if l.startswith(("VmHWM", "VmRSS", "Threads"))],
              len([l for l in open(f"/proc/{pid}/maps") if "cryptography" in l]))
        op.stop()
