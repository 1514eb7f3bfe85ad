"""A few short documents for the framework pipelines, the query they answer, and the config the
pipelines compress with: the frozen f0 encoder, which prunes these short passages (the shipped
recall-first adapter keeps them whole, so nothing would show that compression took place)."""

import canopy_ray

DOCS = [
    ("eiffel", "Eiffel Tower", "The Eiffel Tower stands on the Champ de Mars in Paris. It was built in 1889 as the "
     "entrance to the World's Fair. Its designer's company was run by Gustave Eiffel. The tower is 330 metres "
     "tall. About seven million people visit it each year."),
    ("saturn", "Saturn", "Saturn is the sixth planet from the Sun. It has 146 known moons. Its rings are made "
     "mostly of ice. Titan is its largest moon."),
    ("tulsa", "Tulsa", "Tulsa is the second-largest city in Oklahoma. It was founded in 1836 by the Lochapoka "
     "Band of Creek Native Americans. The city lies on the Arkansas River."),
]
QUERY = "When was the Eiffel Tower built?"

F0 = canopy_ray.load_config(models={"adapter": None})
