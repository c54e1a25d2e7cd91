/* Session 41: two builds of kernels/cpu_ops.c's matmuls on random blocks at the embedded model's shapes (30
 * matrices of each Q4_1 shape, the Q8_0 LM head once), interleaved, best of 30; argv[1] = rows. Build:
 *   for v in orig new; do sed "s/^void q4_1_matmul/void q4_1_matmul_$v/; s/^void q8_0_matmul/void q8_0_matmul_$v/;
 *     s/^void \([a-z_0-9]*_f32\)/static void \1/" $v-source.c > $v.c; done
 *   gcc -O3 -march=native|haswell -fopenmp orig.c new.c c_bench.c -o c_bench -lm -w */
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
int main(int argc,char**argv){
  int M=argc>1?atoi(argv[1]):1;
  int64_t shapes[5][3]={{3072,576,30},{576,1536,30},{960,576,30},{576,576,30},{49152,576,1}};
  double tot[2]={0,0};
  for(int s=0;s<5;s++){
    int64_t N=shapes[s][0],K=shapes[s][1]; int L=shapes[s][2]; int nb=K/32; int q8=(s==4);
    size_t qb=q8?(size_t)N*K:(size_t)N*K/2;
    uint8_t*qs=malloc(L*qb); float*d=malloc(sizeof(float)*L*N*nb),*m=malloc(sizeof(float)*L*N*nb);
    for(size_t i=0;i<L*qb;i++)qs[i]=rand();
    for(size_t i=0;i<(size_t)L*N*nb;i++){d[i]=(rand()%1000)/1e4f;m[i]=-(rand()%1000)/1e4f;}
    float*x=malloc(4*K*M),*y1=malloc(4*N*M),*y2=malloc(4*N*M); for(int i=0;i<K*M;i++)x[i]=(rand()%2000-1000)/1000.f;
    double best[2]={1e9,1e9};
    for(int r=0;r<30;r++) for(int v=0;v<2;v++){
      double t=now();
      for(int l=0;l<L;l++){
        if(q8) (v?q8_0_matmul_new:q8_0_matmul_orig)(x,M,K,(int8_t*)qs+l*qb,d+(size_t)l*N*nb,N,v?y2:y1);
        else (v?q4_1_matmul_new:q4_1_matmul_orig)(x,M,K,qs+l*qb,d+(size_t)l*N*nb,m+(size_t)l*N*nb,N,v?y2:y1);}
      t=now()-t; if(t<best[v])best[v]=t;
    }
    double md=0,mx=0; for(int i=0;i<N*M;i++){double e=fabs(y1[i]-y2[i]); if(e>md)md=e; if(fabs(y1[i])>mx)mx=fabs(y1[i]);}
    tot[0]+=best[0];tot[1]+=best[1];
    printf("%s %lldx%lld x%d: orig %.3f ms new %.3f ms ratio %.3f maxdiff/max %.2e\n",q8?"Q8_0":"Q4_1",(long long)N,(long long)K,L,best[0]*1e3,best[1]*1e3,best[0]/best[1],md/mx);
  }
  printf("M=%d total orig %.2f new %.2f ratio %.3f\n",M,tot[0]*1e3,tot[1]*1e3,tot[0]/tot[1]);
}
