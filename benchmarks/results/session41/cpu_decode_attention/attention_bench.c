/* Session 41: kernels/cpu_ops.c decode_attention_f32, before (467e071 / 8dc0d9e, the same function) and after, on random
 * pools (one sequence s slots in page order), interleaved, best of 200. argv: heads kv_heads batch context. Build:
 *   sed "s/^void decode_attention_f32/void decode_attention_f32_orig/; s/^void \(q[48]_[01]_matmul\|rmsnorm_f32\|rope_f32\|silu_mul_f32\)/static void \1/" before.c > a_orig.c
 *   (the same with _new for the new source), gcc -O3 -march=native -fopenmp a_orig.c a_new.c attention_bench.c -lm -w */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <time.h>
typedef void (*fa)(const float*,int64_t,const float*,int64_t,const float*,int64_t,const int64_t*,float*,float*,const int64_t*,int64_t,const int64_t*,int64_t,int64_t,int64_t,int64_t,float,float*,float*);
void decode_attention_f32_orig(const float*,int64_t,const float*,int64_t,const float*,int64_t,const int64_t*,float*,float*,const int64_t*,int64_t,const int64_t*,int64_t,int64_t,int64_t,int64_t,float,float*,float*);
void decode_attention_f32_new(const float*,int64_t,const float*,int64_t,const float*,int64_t,const int64_t*,float*,float*,const int64_t*,int64_t,const int64_t*,int64_t,int64_t,int64_t,int64_t,float,float*,float*);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int H=atoi(argv[1]),KVH=atoi(argv[2]),D=64; int B=atoi(argv[3]), ctx=atoi(argv[4]);
  int64_t slots_total=65536; float*kp=malloc(4L*slots_total*KVH*D),*vp=malloc(4L*slots_total*KVH*D);
  for(long i=0;i<slots_total*KVH*D;i++){kp[i]=(rand()%2000-1000)/1000.f;vp[i]=(rand()%2000-1000)/1000.f;}
  float*q=malloc(4L*B*H*D),*k=malloc(4L*B*KVH*D),*v=malloc(4L*B*KVH*D);
  for(long i=0;i<B*H*D;i++)q[i]=(rand()%2000-1000)/1000.f; for(long i=0;i<B*KVH*D;i++){k[i]=0.1f;v[i]=0.2f;}
  int64_t*idx=malloc(8L*B*ctx),*lens=malloc(8L*B),*os=malloc(8L*B);
  for(int b=0;b<B;b++){int64_t base=(int64_t)b*((slots_total/B)/16)*16; for(int j=0;j<ctx;j++)idx[b*ctx+j]=base+j; lens[b]=ctx; os[b]=idx[b*ctx+ctx-1];}
  float*o1=malloc(4L*B*H*D),*o2=malloc(4L*B*H*D),*scr=malloc(4L*B*H*ctx);
  fa f[2]={decode_attention_f32_orig,decode_attention_f32_new}; double best[2]={1e9,1e9};
  for(int r=0;r<200;r++)for(int x=0;x<2;x++){double t=now(); f[x](q,H*D,k,KVH*D,v,KVH*D,os,kp,vp,idx,ctx,lens,B,H,KVH,D,0.125f,x?o2:o1,scr); t=now()-t; if(t<best[x])best[x]=t;}
  double md=0; for(long i=0;i<B*H*D;i++){double e=fabs(o1[i]-o2[i]); if(e>md)md=e;}
  printf("H %d KVH %d B %d ctx %d: orig %.1f us new %.1f us ratio %.2f maxdiff %.1e\n",H,KVH,B,ctx,best[0]*1e6,best[1]*1e6,best[0]/best[1],md);
}
