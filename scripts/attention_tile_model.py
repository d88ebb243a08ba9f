"""Numpy model of kernels/cuda/attention.cu's bf16 algorithm at tile granularity: the same tile sizes,
causal tile bounds (keys a query tile can see, the first query tile a key tile is seen by), the
masks and their "full tile" shortcut, zero-filled rows past T and S, the online softmax in base 2,
the two-kernel backward (dq; dk/dv over the GQA group), and bf16 rounding where the kernel rounds
(P and dS before the second product, the forward's stored out; the backward adds into f32 dq, dk,
dv). Checked against a float64 reference. The last part models the ring test of
tests/kernels/cuda/test_attention.cpp (8 backward calls accumulating into the same gradients),
with f32 accumulators (the kernel) and with bf16 ones (the kernel before, for comparison).
It is a model for reviewing the design and the bf16 tolerance of tests/kernels/cuda/test_attention.cpp
(expected ~3e-3 normwise against 1e-2), written without a GPU: NOT a test of the CUDA code, which
only tests_gpu on a GPU checks.

    /usr/bin/python3 scripts/attention_tile_model.py
"""


import numpy as np, math
def bf(x):  # round to bf16 (nearest even) via float32 bits
    x = np.asarray(x, np.float32); u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7fff + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)
def f32(x):  # round to float32
    return np.asarray(x, np.float32).astype(np.float64)
LOG2E = 1.4426950408889634
def ref(q,k,v,qo,ko,dout):
    T,H,D = q.shape; S,KV,_ = k.shape; G = H//KV; sc = 1/math.sqrt(D)
    out = np.zeros_like(q); lse = np.full((H,T), -np.inf); dq=np.zeros_like(q); dk=np.zeros_like(k); dv=np.zeros_like(v)
    for h in range(H):
        g = h//G; s = q[:,h]@k[:,g].T*sc
        vis = (ko+np.arange(S))[None,:] <= (qo+np.arange(T))[:,None]
        s = np.where(vis, s, -np.inf); m = s.max(1, keepdims=True); ok = np.isfinite(m[:,0])
        p = np.where(ok[:,None], np.exp(s - np.where(ok[:,None], m, 0)), 0); l = p.sum(1)
        out[ok,h] = (p[ok]/l[ok,None])@v[:,g]; lse[h,ok] = m[ok,0]+np.log(l[ok])
        P = np.where(ok[:,None], np.exp(s - np.where(ok,lse[h],0)[:,None]), 0)
        delta = (dout[:,h]*out[:,h]).sum(1); dp = dout[:,h]@v[:,g].T; ds = P*(dp-delta[:,None])
        dq[:,h] += sc*ds@k[:,g]; dk[:,g] += sc*ds.T@q[:,h]; dv[:,g] += P.T@dout[:,h]
    return out, lse, dq, dk, dv
def emu_fwd(q,k,v,qo,ko, Br=64, Bc=64):
    T,H,D = q.shape; S,KV,_ = k.shape; G=H//KV; sc=1/math.sqrt(D); sl2 = sc*LOG2E
    out = np.full_like(q, np.nan); lse = np.full((H,T), np.nan)
    for h in range(H):
        g = h//G
        for i0 in range(0, T, Br):
            i_end = min(i0+Br, T); Q = np.zeros((Br,D)); Q[:i_end-i0] = q[i0:i_end,h]
            n_keys = max(0, min(S, qo + i_end - 1 - ko + 1))
            o = np.zeros((Br,D)); m = np.full(Br, -np.inf); l = np.zeros(Br)
            rows = i0 + np.arange(Br)
            for j0 in range(0, n_keys, Bc):
                K = np.zeros((Bc,D)); V = np.zeros((Bc,D)); je = min(j0+Bc,S)
                K[:je-j0] = k[j0:je,g]; V[:je-j0] = v[j0:je,g]
                s = Q@K.T  # f32 accumulate of bf16 products ~ exact here
                full = j0+Bc <= S and ko + j0+Bc-1 <= qo + i0
                cols = j0 + np.arange(Bc)
                okm = np.ones((Br,Bc),bool) if full else (cols[None,:] < S) & (ko+cols[None,:] <= qo+rows[:,None])
                s = np.where(okm, s*sl2, -np.inf)
                mx = s.max(1); mn = np.maximum(m, mx); mu = np.where(mn==-np.inf, 0, mn)
                corr = np.exp2(m - mu); m = mn; l = l*corr
                p = np.exp2(s - mu[:,None]); l = l + p.sum(1); o = o*corr[:,None] + bf(p)@V
            for r in range(i_end-i0):
                inv = 1/l[r] if l[r] > 0 else 0
                out[i0+r,h] = bf(o[r]*inv); lse[h,i0+r] = (m[r]+math.log2(l[r]))*math.log(2) if l[r]>0 else -np.inf
    return out, lse
def emu_bwd(q,k,v,out,lse,dout,qo,ko, dq,dk,dv, store=f32):  # store: the gradients' rounding
    T,H,D = q.shape; S,KV,_ = k.shape; G=H//KV; sc=1/math.sqrt(D); sl2=sc*LOG2E
    delta = np.einsum('thd,thd->ht', dout, out)
    lse2 = np.where(lse==-np.inf, np.inf, lse*LOG2E)
    dq=dq.copy(); dk=dk.copy(); dv=dv.copy()
    # dq kernel
    Br=Bc=64
    for h in range(H):
        g=h//G
        for i0 in range(0,T,Br):
            i_end=min(i0+Br,T); n=i_end-i0; Q=np.zeros((Br,D)); dO=np.zeros((Br,D)); Q[:n]=q[i0:i_end,h]; dO[:n]=dout[i0:i_end,h]
            rows=i0+np.arange(Br); L=np.full(Br,np.inf); L[:n]=lse2[h,i0:i_end]; dl=np.zeros(Br); dl[:n]=delta[h,i0:i_end]
            acc=np.zeros((Br,D)); n_keys=max(0,min(S,qo+i_end-1-ko+1))
            for j0 in range(0,n_keys,Bc):
                je=min(j0+Bc,S); K=np.zeros((Bc,D)); V=np.zeros((Bc,D)); K[:je-j0]=k[j0:je,g]; V[:je-j0]=v[j0:je,g]
                s=Q@K.T; dp=dO@V.T; cols=j0+np.arange(Bc)
                okm=(cols[None,:]<S)&(ko+cols[None,:]<=qo+rows[:,None])
                p=np.where(okm, np.exp2(s*sl2 - L[:,None]), 0); ds=p*(dp-dl[:,None]); acc+=bf(ds)@K
            dq[i0:i_end,h] = store(dq[i0:i_end,h] + sc*acc[:n])
    # dkdv kernel
    Bc=64; Br = 32 if D>=128 else 64
    for g in range(KV):
        for j0 in range(0,S,Bc):
            je=min(j0+Bc,S); K=np.zeros((Bc,D)); V=np.zeros((Bc,D)); K[:je-j0]=k[j0:je,g]; V[:je-j0]=v[j0:je,g]
            dka=np.zeros((Bc,D)); dva=np.zeros((Bc,D)); first=ko+j0-qo; i_first=min(max(first,0),T)
            tile_full = j0+Bc<=S; keys=j0+np.arange(Bc)
            for hh in range(G):
                h=g*G+hh
                for i0 in range((i_first//Br)*Br, T, Br):
                    i_end=min(i0+Br,T); n=i_end-i0; Q=np.zeros((Br,D)); dO=np.zeros((Br,D)); Q[:n]=q[i0:i_end,h]; dO[:n]=dout[i0:i_end,h]
                    L=np.full(Br,np.inf); L[:n]=lse2[h,i0:i_end]; dl=np.zeros(Br); dl[:n]=delta[h,i0:i_end]
                    sT=K@Q.T; dpT=V@dO.T; full = tile_full and ko+j0+Bc-1 <= qo+i0
                    qs=i0+np.arange(Br)
                    okm=np.ones((Bc,Br),bool) if full else (keys[:,None]<S)&(ko+keys[:,None]<=qo+qs[None,:])
                    p=np.where(okm, np.exp2(sT*sl2 - L[None,:]), 0); ds=p*(dpT-dl[None,:])
                    dva+=bf(p)@dO; dka+=bf(ds)@Q
            dk[j0:je,g]=store(dk[j0:je,g]+sc*dka[:je-j0]); dv[j0:je,g]=store(dv[j0:je,g]+dva[:je-j0])
    return dq,dk,dv
def err(a,b):
    m = np.isfinite(b); assert (np.isfinite(a)==m).all() and (a[~m]==b[~m]).all(), "non-finite mismatch"
    return np.abs(a[m]-b[m]).max()/max(np.abs(b[m]).max(),1e-30)
rng=np.random.default_rng(0)
cases=[(77,77,4,2,64,0,0),(64,64,2,2,64,0,0),(130,130,4,1,128,0,0),(200,200,2,1,128,0,0),(50,70,2,1,64,100,60),(40,40,2,2,128,0,20),(33,95,4,2,64,150,0),(300,300,2,1,128,0,0)]
for (T,S,H,KV,D,qo,ko) in cases:
    q=bf(rng.uniform(-2,2,(T,H,D))); k=bf(rng.uniform(-2,2,(S,KV,D))); v=bf(rng.uniform(-1,1,(S,KV,D))); dout=bf(rng.uniform(-1,1,(T,H,D)))
    o,l,_,_,_=ref(q,k,v,qo,ko,dout); eo,el=emu_fwd(q,k,v,qo,ko)
    ob=bf(o); lf=l.astype(np.float32).astype(np.float64)
    dq0=bf(rng.uniform(-1,1,q.shape)); dk0=bf(rng.uniform(-1,1,k.shape)); dv0=bf(rng.uniform(-1,1,v.shape))
    # reference backward on the same (rounded) out and lse
    def refb():
        T_,H_,D_=q.shape; G=H//KV; sc=1/math.sqrt(D); rq=dq0.copy(); rk=dk0.copy(); rv=dv0.copy()
        for h in range(H):
            g=h//G; s=q[:,h]@k[:,g].T*sc; vis=(ko+np.arange(S))[None,:]<=(qo+np.arange(T))[:,None]
            ok=np.isfinite(lf[h]); P=np.where(vis&ok[:,None], np.exp(s-np.where(ok,lf[h],0)[:,None]),0)
            delta=(dout[:,h]*ob[:,h]).sum(1); ds=P*(dout[:,h]@v[:,g].T-delta[:,None])
            rq[:,h]+=sc*ds@k[:,g]; rk[:,g]+=sc*ds.T@q[:,h]; rv[:,g]+=P.T@dout[:,h]
        return rq,rk,rv
    rq,rk,rv=refb(); eq,ek,ev=emu_bwd(q,k,v,ob,lf,dout,qo,ko,dq0,dk0,dv0)
    print((T,S,H,KV,D,qo,ko), "out %.1e lse %.1e dq %.1e dk %.1e dv %.1e" % (err(eo,o), err(el,l), err(eq,rq), err(ek,rk), err(ev,rv)))

# ---- The ring test (CudaAttention.Bf16BackwardAccumulatesInF32): 8 backward calls, one per key
# block of 64 (k_offset 0, 64, ..., 448), for 80 queries at positions 448..527 (block 7 on the
# diagonal), H 4, KV 2, all accumulating into the same dq, dk, dv, which start at bf16 values of
# magnitude [4 R, 8 R) (R: the largest element of the 8 calls' summed contribution). Error:
# max |got - (start + sum of contributions)| over the sum over calls of each call's largest
# contribution (Mtot); the test's tolerance is 5e-3. Also with a zero start, where the bf16
# accumulator's roundings are too small against the increments to show.
def ref_bwd(q,k,v,ob,lf,dout,qo,ko):  # one call's contribution, from zero, in f64
    T,H,D=q.shape; S,KV,_=k.shape; G=H//KV; sc=1/math.sqrt(D)
    rq=np.zeros_like(q); rk=np.zeros_like(k); rv=np.zeros_like(v)
    for h in range(H):
        g=h//G; s=q[:,h]@k[:,g].T*sc; vis=(ko+np.arange(S))[None,:]<=(qo+np.arange(T))[:,None]
        ok=np.isfinite(lf[h]); P=np.where(vis&ok[:,None], np.exp(s-np.where(ok,lf[h],0)[:,None]),0)
        delta=(dout[:,h]*ob[:,h]).sum(1); ds=P*(dout[:,h]@v[:,g].T-delta[:,None])
        rq[:,h]+=sc*ds@k[:,g]; rk[:,g]+=sc*ds.T@q[:,h]; rv[:,g]+=P.T@dout[:,h]
    return rq,rk,rv
print("ring of 8 backward calls, error / Mtot (tolerance 5e-3):")
for D in (64,128):
    H,KV,T,Sb,nb,qo=4,2,80,64,8,448
    q=bf(rng.uniform(-2,2,(T,H,D))); K=bf(rng.uniform(-2,2,(nb*Sb,KV,D))); V=bf(rng.uniform(-1,1,(nb*Sb,KV,D)))
    dout=bf(rng.uniform(-1,1,(T,H,D)))
    o,l,_,_,_=ref(q,K,V,qo,0,dout); ob=bf(o); lf=f32(l)
    cs=[ref_bwd(q,K[s*Sb:(s+1)*Sb],V[s*Sb:(s+1)*Sb],ob,lf,dout,qo,s*Sb) for s in range(nb)]
    tot=[sum(c[i] for c in cs) for i in range(3)]
    Mtot=[sum(np.abs(c[i]).max() for c in cs) for i in range(3)]
    R=[np.abs(t).max() for t in tot]
    for start in (4,0):
        G0=[bf(R[i]*start*rng.uniform(1,2,t.shape)*rng.choice([-1,1],t.shape)) for i,t in enumerate(tot)]
        for name,store in (("f32 (the kernel)",f32),("bf16 (before)",bf)):
            g=[x.copy() for x in G0]
            for s in range(nb):
                g=list(emu_bwd(q,K[s*Sb:(s+1)*Sb],V[s*Sb:(s+1)*Sb],ob,lf,dout,qo,s*Sb,g[0],g[1],g[2],store=store))
            e=[np.abs(g[i]-(G0[i]+tot[i])).max()/Mtot[i] for i in range(3)]
            print("  D %3d start %d R, %-16s accumulators: dq %.1e dk %.1e dv %.1e" % (D,start,name,*e))
