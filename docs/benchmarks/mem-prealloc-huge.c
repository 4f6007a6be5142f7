// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
// Populate methods on hugetlbfs (memfd MFD_HUGETLB), per-thread CPU and wall time.
// gcc -O2 -pthread -o huge mem-prealloc-huge.c
// ./huge MODE MIB THREADS [1g]   (root: echo N > /proc/sys/vm/nr_hugepages first)
// MODE: range (QEMU: one madvise per thread range), rangeend (per page: last 4K, then page),
//       page (one madvise per page), chunk (shared 16-page chunks, one madvise each),
//       chunkend (shared chunks, per page end first: the crate), touch (write first byte), touchend
#define _GNU_SOURCE
#include <sys/mman.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <linux/memfd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static double cpu(){struct rusage r;getrusage(RUSAGE_SELF,&r);return r.ru_utime.tv_sec+r.ru_stime.tv_sec+(r.ru_utime.tv_usec+r.ru_stime.tv_usec)/1e6;}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static char *base; static size_t LEN, PG, NT; static const char *mode; static volatile size_t next;
static pthread_barrier_t bar;
static void pw(char *a, size_t l){ if(madvise(a,l,MADV_POPULATE_WRITE)){perror("madvise");exit(1);} }
static void page_end(char *a){ pw(a+PG-4096,4096); pw(a,PG); }
static void *work(void *arg){ size_t i=(size_t)arg; pthread_barrier_wait(&bar);
  size_t per=LEN/PG/NT*PG; char *s=base+i*per; size_t l= i==NT-1? LEN-i*per: per;
  if(!strcmp(mode,"range")) pw(s,l);
  else if(!strcmp(mode,"rangeend")) for(size_t o=0;o<l;o+=PG) page_end(s+o);
  else if(!strcmp(mode,"page")) for(size_t o=0;o<l;o+=PG) pw(s+o,PG);
  else if(!strcmp(mode,"touch")) for(size_t o=0;o<l;o+=PG) *(volatile char*)(s+o)=0;
  else if(!strcmp(mode,"touchend")) for(size_t o=0;o<l;o+=PG) *(volatile char*)(s+o+PG-1)=0;
  else { size_t CH=16*PG; for(;;){ size_t k=__sync_fetch_and_add(&next,1); size_t st=k*CH; if(st>=LEN) break; size_t n=LEN-st<CH?LEN-st:CH;
      if(!strcmp(mode,"chunk")) pw(base+st,n); else for(size_t o=0;o<n;o+=PG) page_end(base+st+o);} }
  return 0; }
int main(int c,char**v){ mode=v[1]; LEN=(size_t)atol(v[2])<<20; NT=atoi(v[3]); int g=c>4;
  PG= g? 1UL<<30 : 2UL<<20;
  int fd=memfd_create("h", MFD_HUGETLB | (g? MFD_HUGE_1GB: MFD_HUGE_2MB)); if(fd<0){perror("memfd");return 1;}
  if(ftruncate(fd,LEN)){perror("ftruncate");return 1;}
  base=mmap(0,LEN,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); if(base==MAP_FAILED){perror("mmap");return 1;}
  pthread_barrier_init(&bar,0,NT+1); pthread_t t[16];
  for(size_t i=0;i<NT;i++) pthread_create(&t[i],0,work,(void*)i);
  double c0=cpu(), t0=now(); pthread_barrier_wait(&bar);
  for(size_t i=0;i<NT;i++) pthread_join(t[i],0);
  double t1=now(), c1=cpu();
  printf("%-9s %zuMiB %zuT %s: wall %.4f s cpu %.4f s %.2f GiB/s\n",mode,LEN>>20,NT,g?"1G":"2M",t1-t0,c1-c0,(LEN/1073741824.0)/(t1-t0));
  return 0; }
