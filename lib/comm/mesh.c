/*
 * mesh.c - dims, coordinates and groups of a layout (see mesh.h).
 */
#include "comm/mesh.h"

/* Each dim: its mesh and its axis in that mesh. */
static const struct { const char *name; enum hp_mesh mesh; int axis; } dims[HP_NDIM] = {
	[HP_DIM_DP] = { "dp", HP_MESH_DENSE, 0 },
	[HP_DIM_CP] = { "cp", HP_MESH_DENSE, 1 },
	[HP_DIM_TP] = { "tp", HP_MESH_DENSE, 2 },
	[HP_DIM_DP_REPLICATE] = { "dp_replicate", HP_MESH_FSDP, 0 },
	[HP_DIM_DP_SHARD] = { "dp_shard", HP_MESH_FSDP, 1 },
	[HP_DIM_EDP_REPLICATE] = { "edp_replicate", HP_MESH_EXPERT, 0 },
	[HP_DIM_EDP_SHARD] = { "edp_shard", HP_MESH_EXPERT, 1 },
	[HP_DIM_EP] = { "ep", HP_MESH_EXPERT, 2 },
	[HP_DIM_PP] = { "pp", HP_MESH_PIPELINE, 0 },
};

static const char *const mesh_names[HP_NMESH] = { "dense", "fsdp", "expert", "pipeline" };

static const char *const coll_names[HP_NCOLL] = {
	"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "all_to_allv", "p2p",
};

const char *hp_dim_name(enum hp_dim d)
{
	return (unsigned)d < HP_NDIM ? dims[d].name : "?";
}

const char *hp_mesh_name(enum hp_mesh m)
{
	return (unsigned)m < HP_NMESH ? mesh_names[m] : "?";
}

enum hp_mesh hp_dim_mesh(enum hp_dim d)
{
	return dims[d].mesh;
}

const char *hp_coll_name(enum hp_coll c)
{
	return (unsigned)c < HP_NCOLL ? coll_names[c] : "?";
}

const char *hp_comm_dim_name(int d)
{
	return d == HP_COMM_WORLD ? "world" : hp_dim_name((enum hp_dim)d);
}

/* A stage's ranks: dp * cp * tp. */
static long stage_world(const int size[HP_NDIM])
{
	return (long)size[HP_DIM_DP] * size[HP_DIM_CP] * size[HP_DIM_TP];
}

int hp_mesh_world(const int size[HP_NDIM])
{
	return (int)(stage_world(size) * (size[HP_DIM_PP] > 0 ? size[HP_DIM_PP] : 1));
}

/* The fsdp mesh's third axis is tp; the pipeline's one axis steps over
 * whole stages. */
static long dim_stride(const int size[HP_NDIM], enum hp_dim d)
{
	static const enum hp_dim axes[HP_NMESH - 1][3] = {
		[HP_MESH_DENSE] = { HP_DIM_DP, HP_DIM_CP, HP_DIM_TP },
		[HP_MESH_FSDP] = { HP_DIM_DP_REPLICATE, HP_DIM_DP_SHARD, HP_DIM_TP },
		[HP_MESH_EXPERT] = { HP_DIM_EDP_REPLICATE, HP_DIM_EDP_SHARD, HP_DIM_EP },
	};
	long s = 1;

	if (dims[d].mesh == HP_MESH_PIPELINE)
		return stage_world(size);
	for (int a = dims[d].axis + 1; a < 3; a++)
		s *= size[axes[dims[d].mesh][a]];
	return s;
}

/* How many stages (a layout made before pipelines has pp 0). */
static int stages(const int size[HP_NDIM])
{
	return size[HP_DIM_PP] > 0 ? size[HP_DIM_PP] : 1;
}

int hp_mesh_coord(const int size[HP_NDIM], enum hp_dim d, int rank)
{
	if (d == HP_DIM_PP)
		return (int)(rank / stage_world(size));
	/* within the rank's stage */
	return (int)(((rank % stage_world(size)) / dim_stride(size, d)) % size[d]);
}

int hp_mesh_group(const int size[HP_NDIM], enum hp_dim d, int rank, int *ranks)
{
	long st = dim_stride(size, d);
	long base = rank - (long)hp_mesh_coord(size, d, rank) * st;
	int n = d == HP_DIM_PP ? stages(size) : size[d];

	for (int i = 0; i < n; i++)
		ranks[i] = (int)(base + i * st);
	return n;
}
