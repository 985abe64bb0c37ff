/* An experiment for BENCHMARKS.md ("4 ranks over TCP: the ring's order in four steps"), not
 * part of the product. A 4-rank all-reduce of float32 sums over loopback TCP, in two schedules
 * that sum alike, bit for bit (each element of chunk c as ((x_c + x_c+1) + x_c+2) + x_c+3,
 * ranks mod 4, the order of our ring):
 *   ring   the ring: 3 reduce-scatter and 3 all-gather steps over the links to r+1
 *   halve  4 steps, as recursive halving and doubling take, over links at distance 1 and 2:
 *          (1) send chunks r and r-2 raw to r+1; r-1's chunk r-1 is summed, its chunk r+1 kept
 *          raw; (2) send the partial sum of chunk r-1 to r+2; with r-2's partial, r sums chunk
 *          r+1 whole; (3) send it to r+2, receive chunk r-1 whole; (4) send chunks r+1 and r-1
 *          to r+1, receive chunks r and r-2 from r-1.
 * Each step runs non-blocking reads and writes, sleeping in poll(2), summing 64 KiB pieces as
 * they arrive. Prints this rank's mean per operation and a checksum (equal across modes after
 * one operation; later ones overflow). Args: RANK PORTBASE SIZE ITERS ring|halve. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#define N 4
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void die(const char*w){perror(w);exit(1);}
static int rank, base;
static int lsock;
static int dialto(int peer, int tag){
  struct sockaddr_in a={.sin_family=AF_INET,.sin_port=htons(base+peer)}; inet_pton(AF_INET,"127.0.0.1",&a.sin_addr);
  for(int t=0;;t++){int s=socket(AF_INET,SOCK_STREAM,0); if(connect(s,(void*)&a,sizeof a)==0){ char b[2]={rank,tag}; write(s,b,2); return s;} close(s); if(t>4000) die("connect"); usleep(2000);}
}
static int in_from[N][3]; /* accepted: [peer][tag] */
static void acceptn(int k){ for(int i=0;i<k;i++){int s=accept(lsock,NULL,NULL); char b[2]; if(read(s,b,2)!=2) die("hs"); in_from[(int)b[0]][(int)b[1]]=s;} }
static void nb(int s){int one=1; setsockopt(s,IPPROTO_TCP,TCP_NODELAY,&one,sizeof one); fcntl(s,F_SETFL,O_NONBLOCK);}
/* one step: send sn bytes from sv to fd so, receive rn bytes into rv from fd si; call sum on each received 64K piece */
typedef void (*sumfn)(size_t off, size_t len);
#define PIECE (64<<10)
static void step(int so, const char*sv, size_t sn, int si, char*rv, size_t rn, sumfn f){
  size_t s=0,r=0,summed=0;
  while(s<sn||r<rn){ int moved=0;
    if(s<sn){ssize_t w=write(so,sv+s,sn-s); if(w>0){s+=w;moved=1;} else if(errno!=EAGAIN) die("write");}
    if(r<rn){ssize_t g=read(si,rv+r,rn-r); if(g>0){r+=g;moved=1;} else if(g==0) {fprintf(stderr,"eof\n");exit(1);} else if(errno!=EAGAIN) die("read");}
    while(f && r-summed>=PIECE){f(summed,PIECE);summed+=PIECE;}
    if(!moved){struct pollfd p[2]={{so,s<sn?POLLOUT:0,0},{si,r<rn?POLLIN:0,0}}; poll(p,2,1000);}
  }
  if(f && r>summed) f(summed,r-summed);
}
static float *buf,*tmp,*tmp2; static size_t C; /* floats per chunk */
static int mod(int x){return ((x%N)+N)%N;}
static float *ch(int c){return buf+(size_t)mod(c)*C;}
/* halve: step1 recv layout in tmp: [chunk r-1 raw][chunk r+1 raw] */
static void sum_s1(size_t off,size_t len){ /* bytes off into tmp */
  size_t cb=C*4, e=off+len<cb?off+len:cb; float*d=ch(rank-1); for(size_t i=off/4;i<e/4;i++) d[i]=tmp[i]+d[i];
}
static void sum_s2(size_t off,size_t len){ float*d=ch(rank+1); float*raw=tmp+C; for(size_t i=off/4;i<(off+len)/4;i++) d[i]=(tmp2[i]+raw[i])+d[i]; }
static int ringc; static void sum_ring(size_t off,size_t len){ float*d=ch(ringc); for(size_t i=off/4;i<(off+len)/4;i++) d[i]=tmp[i]+d[i]; }
int main(int argc,char**argv){
  rank=atoi(argv[1]); base=atoi(argv[2]); size_t S=atol(argv[3]); long iters=atol(argv[4]); int halve=strcmp(argv[5],"halve")==0;
  lsock=socket(AF_INET,SOCK_STREAM,0); int one=1; setsockopt(lsock,SOL_SOCKET,SO_REUSEADDR,&one,sizeof one);
  struct sockaddr_in me={.sin_family=AF_INET,.sin_port=htons(base+rank)}; inet_pton(AF_INET,"127.0.0.1",&me.sin_addr);
  if(bind(lsock,(void*)&me,sizeof me)||listen(lsock,8)) die("listen");
  int o1=dialto(mod(rank+1),1), o2=dialto(mod(rank+2),2); acceptn(2);
  int i1=in_from[mod(rank-1)][1], i2=in_from[mod(rank-2)][2];
  nb(o1);nb(o2);nb(i1);nb(i2);
  C=S/4/N; buf=malloc(S); tmp=malloc(S); tmp2=malloc(S); float*sendb=malloc(S);
  for(size_t i=0;i<S/4;i++) buf[i]=(float)(rank+1)*0.001f*(float)(i%1000);
  size_t cb=C*4; long warm=iters/10+2; double t0=0;
  for(long it=0;it<iters+warm;it++){
    if(it==warm){char t=0; step(o1,&t,1,i1,&t,1,NULL); t0=now();}
    if(halve){
      memcpy(sendb,ch(rank),cb); memcpy((char*)sendb+cb,ch(rank-2),cb);
      step(o1,(char*)sendb,2*cb,i1,(char*)tmp,2*cb,sum_s1);
      step(o2,(char*)ch(rank-1),cb,i2,(char*)tmp2,cb,sum_s2);
      step(o2,(char*)ch(rank+1),cb,i2,(char*)ch(rank-1),cb,NULL);
      memcpy(sendb,ch(rank+1),cb); memcpy((char*)sendb+cb,ch(rank-1),cb);
      step(o1,(char*)sendb,2*cb,i1,(char*)tmp,2*cb,NULL);
      memcpy(ch(rank),tmp,cb); memcpy(ch(rank-2),(char*)tmp+cb,cb);
    } else {
      for(int k=0;k<N-1;k++){ ringc=rank-k-1; step(o1,(char*)ch(rank-k),cb,i1,(char*)tmp,cb,sum_ring);}
      for(int k=0;k<N-1;k++){ step(o1,(char*)ch(rank+1-k),cb,i1,(char*)ch(rank-k),cb,NULL);}
    }
  }
  double el=now()-t0;
  /* checksum */ double cs=0; for(size_t i=0;i<S/4;i+=97) cs+=buf[i];
  printf("%s rank %d size %zu: %.1f us/op checksum %.6f\n",halve?"halve":"ring",rank,S,el/iters*1e6,cs);
  return 0;
}
