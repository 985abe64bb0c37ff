/* An experiment for BENCHMARKS.md ("4 ranks over TCP: the ring's order in four steps"), not
 * part of the product: ring_order4.c's four-step schedule ("halve"), pipelined. One progress
 * loop of non-blocking reads and writes over the four links (to r+1 and r+2, from r-1 and
 * r-2); each stream's bytes become sendable as the receipts they depend on are summed, in
 * 64 KiB pieces, so that the steps overlap as our ring's chunks do. Sums in the ring's order,
 * bit for bit (its checksum after one operation equals ring_order4's ring). Prints this rank's
 * mean per operation and the checksum. Args: RANK PORTBASE SIZE ITERS [PIECE] (ranks listen on PORTBASE+RANK). */
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
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#define N 4
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void die(const char*w){perror(w);exit(1);}
static int rank, base, lsock, in_from[N][3];
static int dialto(int peer,int tag){struct sockaddr_in a={.sin_family=AF_INET,.sin_port=htons(base+peer)};inet_pton(AF_INET,"127.0.0.1",&a.sin_addr);
 for(int t=0;;t++){int s=socket(AF_INET,SOCK_STREAM,0);if(connect(s,(void*)&a,sizeof a)==0){char b[2]={rank,tag};write(s,b,2);return s;}close(s);if(t>4000)die("connect");usleep(2000);}}
static void acceptn(int k){for(int i=0;i<k;i++){int s=accept(lsock,NULL,NULL);char b[2];if(read(s,b,2)!=2)die("hs");in_from[(int)b[0]][(int)b[1]]=s;}}
static void nb(int s){int one=1;setsockopt(s,IPPROTO_TCP,TCP_NODELAY,&one,sizeof one);fcntl(s,F_SETFL,O_NONBLOCK);}
static float *buf,*raw,*part,*rx; static size_t C,CB; static size_t PIECE=64<<10;
static int mod(int x){return ((x%N)+N)%N;}
static char *ch(int c){return (char*)(buf+(size_t)mod(c)*C);}
int main(int argc,char**argv){
 rank=atoi(argv[1]);base=atoi(argv[2]);size_t S=atol(argv[3]);long iters=atol(argv[4]); if(argc>5) PIECE=atol(argv[5]);
 lsock=socket(AF_INET,SOCK_STREAM,0);int one=1;setsockopt(lsock,SOL_SOCKET,SO_REUSEADDR,&one,sizeof one);
 struct sockaddr_in me={.sin_family=AF_INET,.sin_port=htons(base+rank)};inet_pton(AF_INET,"127.0.0.1",&me.sin_addr);
 if(bind(lsock,(void*)&me,sizeof me)||listen(lsock,8))die("listen");
 int o1=dialto(mod(rank+1),1),o2=dialto(mod(rank+2),2);acceptn(2);
 int i1=in_from[mod(rank-1)][1],i2=in_from[mod(rank-2)][2];nb(o1);nb(o2);nb(i1);nb(i2);
 C=S/4/N;CB=C*4;buf=malloc(S);rx=malloc(S);raw=malloc(CB);part=malloc(CB);
 for(size_t i=0;i<S/4;i++)buf[i]=(float)(rank+1)*1e-3f*(float)(i%1000);
 long warm=iters/10+2;double t0=0;
 for(long it=0;it<iters+warm;it++){
  if(it==warm){char t=0;while(write(o1,&t,1)!=1);while(read(i1,&t,1)!=1);t0=now();}
  /* streams: o1: [ch r][ch r-2] (ready) then [ch r+1 final][ch r-1 final]
              i1: [ch r-1 raw -> sum][ch r+1 raw -> raw]  then [ch r][ch r-2]
              o2: [ch r-1 partial] then [ch r+1 final]
              i2: [partial of r+1 -> part, sum final] then [ch r-1 final] */
  size_t s1=0,r1=0,s2=0,r2=0,sum1=0,sum2=0; /* bytes moved per stream; sum1: bytes of ch r-1 summed; sum2: bytes of ch r+1 final */
  size_t T=4*CB, T2=2*CB;
  while(s1<T||r1<T||s2<T2||r2<T2){int moved=0;
   /* sums first */
   size_t got=r1<CB?r1:CB; while(sum1+PIECE<=got||(got==CB&&sum1<CB)){size_t e=sum1+PIECE<CB?sum1+PIECE:CB; float*d=(float*)ch(rank-1);
     for(size_t i=sum1/4;i<e/4;i++) d[i]=rx[i]+d[i]; sum1=e;}
   size_t rawgot=r1>CB?(r1<2*CB?r1-CB:CB):0; size_t pg=r2<CB?r2:CB; size_t lim=rawgot<pg?rawgot:pg;
   while(sum2+PIECE<=lim||(lim==CB&&sum2<CB)){size_t e=sum2+PIECE<CB?sum2+PIECE:CB;float*d=(float*)ch(rank+1);for(size_t i=sum2/4;i<e/4;i++)d[i]=(part[i]+raw[i])+d[i];sum2=e;}
   /* o1 */
   if(s1<T){size_t avail; char*p; size_t off;
     if(s1<2*CB){avail=2*CB;} else if(s1<3*CB){avail=2*CB+sum2;} else {size_t rc=r2>CB?r2-CB:0; avail=3*CB+rc;}
     if(s1<avail){ if(s1<CB){p=ch(rank);off=s1;} else if(s1<2*CB){p=ch(rank-2);off=s1-CB;} else if(s1<3*CB){p=ch(rank+1);off=s1-2*CB;} else {p=ch(rank-1);off=s1-3*CB;}
       size_t segend=((s1/CB)+1)*CB; size_t n=(avail<segend?avail:segend)-s1; ssize_t w=write(o1,p+off,n); if(w>0){s1+=w;moved=1;}else if(errno!=EAGAIN)die("w1");}}
   /* o2 */
   if(s2<T2){size_t avail=s2<CB?sum1:CB+sum2; if(s2<avail){char*p=s2<CB?ch(rank-1)+s2:ch(rank+1)+(s2-CB); size_t segend=s2<CB?CB:2*CB; size_t n=(avail<segend?avail:segend)-s2; ssize_t w=write(o2,p,n);if(w>0){s2+=w;moved=1;}else if(errno!=EAGAIN)die("w2");}}
   /* i1 */
   if(r1<T){char*p;size_t segend; if(r1<CB){p=(char*)rx+r1;segend=CB;} else if(r1<2*CB){p=(char*)raw+(r1-CB);segend=2*CB;} else if(r1<3*CB){p=ch(rank)+(r1-2*CB);segend=3*CB;} else {p=ch(rank-2)+(r1-3*CB);segend=4*CB;}
     ssize_t g=read(i1,p,segend-r1); if(g>0){r1+=g;moved=1;}else if(g==0)exit(1);else if(errno!=EAGAIN)die("r1");}
   /* i2: final of ch r-1 may only land after we sent our partial of it (s2>=CB covers the piece) */
   if(r2<T2){char*p;size_t lim; if(r2<CB){p=(char*)part+r2;lim=CB;} else {p=ch(rank-1)+(r2-CB); lim=CB+s2; if(lim>T2)lim=T2;}
     if(r2<lim){ssize_t g=read(i2,p,lim-r2);if(g>0){r2+=g;moved=1;}else if(g==0)exit(1);else if(errno!=EAGAIN)die("r2");}}
   if(!moved){ size_t a1; if(s1<2*CB)a1=2*CB; else if(s1<3*CB)a1=2*CB+sum2; else a1=3*CB+(r2>CB?r2-CB:0);
     size_t a2=s2<CB?sum1:CB+sum2; size_t l2=r2<CB?CB:(CB+s2>T2?T2:CB+s2);
     struct pollfd pf[4]={{o1,(s1<T&&s1<a1)?POLLOUT:0,0},{o2,(s2<T2&&s2<a2)?POLLOUT:0,0},{i1,r1<T?POLLIN:0,0},{i2,(r2<T2&&r2<l2)?POLLIN:0,0}};poll(pf,4,1000);}
  }
 }
 double el=now()-t0; double cs=0;for(size_t i=0;i<S/4;i+=97)cs+=buf[i];
 printf("pipe rank %d size %zu: %.1f us/op checksum %.6f\n",rank,S,el/iters*1e6,cs);return 0;}

