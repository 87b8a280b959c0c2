import sys, time; sys.path.insert(0, "."); from pd import *
q = Q10 if sys.argv[1] == "10" else Q7
t=time.time(); vm = VM("smoke", 512, "/dev/shm/pd-smoke.ram", memw="256,256,8", qemu=q)
vm.wait_console("FILLED"); print("filled after", time.time()-t)
time.sleep(3); print(open(vm.console).read()[-600:])
vm.close(); os.remove("/dev/shm/pd-smoke.ram")
