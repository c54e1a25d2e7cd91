/* Session 42: one decode step's matmuls at the embedded model's shapes and order (30 layers of qkv 960x576,
 * o 576x576, gate_up 3072x576, down 576x1536, all Q4_1, then the Q8_0 LM head 49152x576: 111 MB of random blocks),
 * through two builds of kernels/cpu_ops.c, alternating pass by pass; median and best of 40 passes; argv[1] = rows.
 * Build: see host.sh (the two sources' exported matmuls renamed _orig and _new). */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <time.h>
void q4_1_matmul_orig(const float*,int64_t,int64_t,const uint8_t*,const float*,const float*,int64_t,float*);
void q4_1_matmul_new(const float*,int64_t,int64_t,const uint8_t*,const float*,const float*,int64_t,float*);
void q8_0_matmul_orig(const float*,int64_t,int64_t,const int8_t*,const float*,int64_t,float*);
void q8_0_matmul_new(const float*,int64_t,int64_t,const int8_t*,const float*,int64_t,float*);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
typedef struct {int64_t N,K;int q8;uint8_t*qs;float*d,*m;} Mat;
int main(int argc,char**argv){
  int M=argc>1?atoi(argv[1]):1;
  int64_t shapes[4][2]={{960,576},{576,576},{3072,576},{576,1536}};
  Mat mats[121]; int nm=0;
  for(int l=0;l<30;l++) for(int s=0;s<4;s++) mats[nm++]=(Mat){shapes[s][0],shapes[s][1],0};
  mats[nm++]=(Mat){49152,576,1};
  double bytes=0;
  for(int i=0;i<nm;i++){Mat*a=&mats[i]; int64_t nb=a->K/32; size_t qb=a->q8?(size_t)a->N*a->K:(size_t)a->N*a->K/2;
    a->qs=malloc(qb); a->d=malloc(4*a->N*nb); a->m=malloc(4*a->N*nb);
    for(size_t j=0;j<qb;j++)a->qs[j]=rand();
    for(int64_t j=0;j<a->N*nb;j++){a->d[j]=(rand()%1000)/1e4f;a->m[j]=-(rand()%1000)/1e4f;}
    bytes+=qb+4.0*a->N*nb*(a->q8?1:2);}
  float*x=malloc(4*1536*M),*y1=malloc(4*49152*M),*y2=malloc(4*49152*M);
  for(int i=0;i<1536*M;i++)x[i]=(rand()%2000-1000)/1000.f;
  double t[2][40]; double md=0,mx=0;
  for(int r=0;r<40;r++) for(int vv=0;vv<2;vv++){int v=r%2?1-vv:vv;
    double t0=now();
    for(int i=0;i<nm;i++){Mat*a=&mats[i]; float*y=v?y2:y1;
      if(a->q8)(v?q8_0_matmul_new:q8_0_matmul_orig)(x,M,a->K,(int8_t*)a->qs,a->d,a->N,y);
      else (v?q4_1_matmul_new:q4_1_matmul_orig)(x,M,a->K,a->qs,a->d,a->m,a->N,y);}
    t[v][r]=now()-t0;}
  for(int i=0;i<49152*M;i++){double e=fabs(y1[i]-y2[i]); if(e>md)md=e; if(fabs(y1[i])>mx)mx=fabs(y1[i]);}
  qsort(t[0],40,sizeof(double),cmp); qsort(t[1],40,sizeof(double),cmp);
  printf("M=%d %.0f MB: orig median %.2f best %.2f ms, new median %.2f best %.2f ms, median ratio %.3f, LM head maxdiff/max %.1e\n",
    M,bytes/1e6,t[0][20]*1e3,t[0][0]*1e3,t[1][20]*1e3,t[1][0]*1e3,t[0][20]/t[1][20],md/mx);
}
