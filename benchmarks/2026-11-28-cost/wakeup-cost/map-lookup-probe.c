#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/bpf.h>
static double clk(int c){struct timespec t;clock_gettime(c,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int main(void){
  for (int type=BPF_MAP_TYPE_HASH; type<=BPF_MAP_TYPE_ARRAY; type++) for (int vs=64; vs<=1024; vs*=16) {
    union bpf_attr a; memset(&a,0,sizeof a); a.map_type=type; a.key_size=4; a.value_size=vs; a.max_entries=4096;
    int fd=syscall(SYS_bpf,BPF_MAP_CREATE,&a,sizeof a); if(fd<0){perror("create");return 1;}
    char val[1024]={0}; unsigned key=0;
    memset(&a,0,sizeof a); a.map_fd=fd; a.key=(unsigned long)&key; a.value=(unsigned long)val; a.flags=BPF_ANY;
    syscall(SYS_bpf,BPF_MAP_UPDATE_ELEM,&a,sizeof a);
    int n=2000; double c0=clk(CLOCK_THREAD_CPUTIME_ID), w0=clk(CLOCK_MONOTONIC);
    for(int i=0;i<n;i++){memset(&a,0,sizeof a); a.map_fd=fd; a.key=(unsigned long)&key; a.value=(unsigned long)val; syscall(SYS_bpf,BPF_MAP_LOOKUP_ELEM,&a,sizeof a);}
    printf("%s value %d: lookup cpu %.2f us wall %.2f us\n", type==1?"hash":"array", vs, (clk(CLOCK_THREAD_CPUTIME_ID)-c0)/n,(clk(CLOCK_MONOTONIC)-w0)/n);
    close(fd);
  }
  double c0=clk(CLOCK_THREAD_CPUTIME_ID); for(int i=0;i<2000;i++) clk(CLOCK_THREAD_CPUTIME_ID);
  printf("thread cpu clock read %.2f us\n",(clk(CLOCK_THREAD_CPUTIME_ID)-c0)/2000);
  return 0;}
