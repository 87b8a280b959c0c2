"""The guest's steady write rate with its RAM on tmpfs (the reference for
exp_c.py's pagefs rate). Usage: exp_rate.py INUSE_MIB"""
import sys, time; sys.path.insert(0, "."); from pd import *
inuse = int(sys.argv[1]); mem = inuse + (256 if inuse <= 1024 else 768); ram = "/dev/shm/pd-rate.ram"
vm = VM("rate", mem, ram, memw=f"{inuse},{inuse},8")
try:
    vm.wait_console("FILLED"); time.sleep(3); c = vm.console_at(); time.sleep(5)
    print(f"write rate, ram on tmpfs, inuse={inuse}, steady:", statistics.median(vm.rates(c)), flush=True)
finally:
    vm.close(); os.remove(ram)
