// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
// Populate methods side by side, for perf (docs/benchmarks/mem-prealloc.md).
// gcc -O2 -pthread -o pop mem-prealloc-pop.c
// ./pop MODE MIB THREADS [CHUNK_MIB [HUGETLBFS_FILE]]; MODE: pw pr mp fapw fcpw anonpw
#define _GNU_SOURCE
#include <sys/mman.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <sys/resource.h>
static double cpu(){struct rusage r;getrusage(RUSAGE_SELF,&r);return r.ru_utime.tv_sec+r.ru_stime.tv_sec+(r.ru_utime.tv_usec+r.ru_stime.tv_usec)/1e6;}
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif
static size_t LEN, CHUNK; static char *base; static int adv; static int nthr; static int fdg; static int perchunk;
static volatile size_t next;
static void *work(void *a){ for(;;){ size_t i=__sync_fetch_and_add(&next,1); size_t s=i*CHUNK; if(s>=LEN) break; size_t l=LEN-s<CHUNK?LEN-s:CHUNK; if(perchunk && fallocate(fdg,0,s,l)){perror("fallocate chunk");exit(1);} if(madvise(base+s,l,adv)){perror("madvise");exit(1);} } return 0; }
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int c, char**v){
  const char*mode=v[1]; LEN=(size_t)atol(v[2])<<20; nthr=atoi(v[3]); CHUNK=(size_t)(c>4?atol(v[4]):32)<<20;
  const char*path=c>5?v[5]:0;
  int fd=-1; int anon=!strncmp(mode,"anon",4);
  if(!anon){ fd = path? open(path,O_RDWR|O_CREAT|O_TRUNC,0600) : memfd_create("m",0); if(fd<0){perror("fd");return 1;} if(path) unlink(path); if(ftruncate(fd,LEN)){perror("trunc");return 1;} }
  double c0=cpu(); double t0=now();
  fdg=fd; perchunk=strstr(mode,"fc")!=0; if(strstr(mode,"fa")) { if(fallocate(fd,0,0,LEN)){perror("fallocate");return 1;} }
  double t1=now();
  if(strstr(mode,"mp")) { base=mmap(0,LEN,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_POPULATE,fd,0); }
  else { base= anon? mmap(0,LEN,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0) : mmap(0,LEN,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);
    if(base==MAP_FAILED){perror("mmap");return 1;}
    if(anon) madvise(base,LEN,MADV_NOHUGEPAGE);
    adv = strstr(mode,"pr")?MADV_POPULATE_READ: strstr(mode,"pw")?MADV_POPULATE_WRITE:0;
    if(adv){ pthread_t t[16]; for(int i=0;i<nthr;i++) pthread_create(&t[i],0,work,0); for(int i=0;i<nthr;i++) pthread_join(t[i],0);} }
  if(base==MAP_FAILED){perror("mmap");return 1;}
  double t2=now(); double c2=cpu();
  printf("%s %zuMiB %dT chunk %zuMiB: cpu %.3f s total %.3f s (fallocate %.3f) %.2f GiB/s\n",mode,LEN>>20,nthr,CHUNK>>20,c2-c0,t2-t0,t1-t0,(LEN/1073741824.0)/(t2-t0));
  return 0;}
