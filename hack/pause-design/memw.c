// memw: a guest memory-write benchmark for the pause design experiment
// (docs/design/constant-time-pause.md). Throwaway: not part of cryo.
// memw FILL_MIB WRITE_MIB STRIDE: fills FILL_MIB with non-zero data, then
// writes STRIDE bytes into every 4 KiB page of the first WRITE_MIB, sweep
// after sweep, and prints "R <ms> <pages/s>" every 100 ms.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
int main(int argc,char**argv){
  size_t fill=(size_t)atol(argv[1])<<20, wr=(size_t)atol(argv[2])<<20; int stride=atoi(argv[3]);
  uint8_t*b=mmap(0,fill,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE,-1,0);
  if(b==MAP_FAILED){perror("mmap");return 1;}
  uint64_t x=88172645463325252ull; double t0=now();
  for(size_t i=0;i<fill;i+=8){x^=x<<13;x^=x>>7;x^=x<<17;*(uint64_t*)(b+i)=x;}
  printf("FILLED %zu MiB in %.0f ms\n",fill>>20,now()-t0); fflush(stdout);
  if(wr==0){for(;;)sleep(1000);}
  uint64_t gen=0,pages=0; double last=now(),start=last;
  for(;;){gen++;
    for(size_t p=0;p<wr;p+=4096){ if(stride>=4096) memset(b+p,(int)gen,4096); else *(uint64_t*)(b+p)=gen^p; pages++;
      if((pages&1023)==0){double t=now(); if(t-last>=100){printf("R %.0f %.0f\n",t-start,pages*1000.0/(t-last));fflush(stdout);pages=0;last=t;}}}
  }
}
