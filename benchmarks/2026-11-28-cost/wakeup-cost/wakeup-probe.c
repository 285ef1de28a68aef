#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <sys/timerfd.h>
#include <sys/epoll.h>
static double clk(int c){struct timespec t;clock_gettime(c,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static double sst(void){FILE*f=fopen("/proc/thread-self/schedstat","r");unsigned long long a=0;fscanf(f,"%llu",&a);fclose(f);return a/1e3;}
int main(void){
  int ep=epoll_create1(0); struct epoll_event out[8];
  int tfd=timerfd_create(CLOCK_MONOTONIC,TFD_NONBLOCK);
  struct epoll_event ev={.events=EPOLLIN}; epoll_ctl(ep,EPOLL_CTL_ADD,tfd,&ev);
  for (int ms=1; ms<=50; ms*=50) {
    int n = ms==1 ? 400 : 40;
    double w0=clk(CLOCK_MONOTONIC), c0=clk(CLOCK_THREAD_CPUTIME_ID), s0=sst();
    for(int i=0;i<n;i++) epoll_wait(ep,out,8,ms);
    printf("epoll timeout %d ms: wall %.0f us/cycle, thread cpu %.1f us/cycle, schedstat %.1f us/cycle\n", ms,(clk(CLOCK_MONOTONIC)-w0)/n,(clk(CLOCK_THREAD_CPUTIME_ID)-c0)/n,(sst()-s0)/n);
    w0=clk(CLOCK_MONOTONIC); c0=clk(CLOCK_THREAD_CPUTIME_ID); s0=sst();
    unsigned long long x;
    for(int i=0;i<n;i++){struct itimerspec its={0}; its.it_value.tv_nsec=ms*1000000; timerfd_settime(tfd,0,&its,0); epoll_wait(ep,out,8,-1); read(tfd,&x,8);}
    printf("timerfd %d ms: wall %.0f us/cycle, thread cpu %.1f us/cycle, schedstat %.1f us/cycle\n", ms,(clk(CLOCK_MONOTONIC)-w0)/n,(clk(CLOCK_THREAD_CPUTIME_ID)-c0)/n,(sst()-s0)/n);
  }
  return 0;}
